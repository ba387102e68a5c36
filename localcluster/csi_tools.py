"""The CSI project's conformance suite, ``csi-sanity``, built from its Go module.

The bridge is checked by the tool every CSI driver is checked by, not by a copy of it:
``csi-sanity`` from ``github.com/kubernetes-csi/csi-test/v5``, pinned here, built once per
machine like the cluster's other Go parts (:mod:`localcluster.gobuild`) and run against
the real bridge in the component layer (``tests/component/test_csi_sanity.py``).

The sidecars every CSI driver ships with (``node-driver-registrar``, ``livenessprobe``)
are not built: the module proxy this project's machines reach serves no version of either
(docs/csi-bridge.md).
"""

from __future__ import annotations

from pathlib import Path

from .gobuild import GoBuild, ensure_built

CSI_TEST_MODULE = "github.com/kubernetes-csi/csi-test/v5"
CSI_TEST_VERSION = "5.6.0"


def csi_sanity_build() -> GoBuild:
    return GoBuild(name=f"csi-sanity-{CSI_TEST_VERSION}", requires={CSI_TEST_MODULE: f"v{CSI_TEST_VERSION}"},
                   commands={"csi-sanity": f"{CSI_TEST_MODULE}/cmd/csi-sanity"}, log="csi-tools-build.log",
                   what=f"building csi-sanity {CSI_TEST_VERSION} from its Go module (first run, about 2 min)")


def csi_sanity() -> Path:
    """The ``csi-sanity`` binary, built first if this machine has none."""
    return ensure_built(csi_sanity_build()) / "csi-sanity"


if __name__ == "__main__":
    print(csi_sanity())
