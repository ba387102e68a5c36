"""The main job: a local demo of Resident on a real control plane.

Today it brings up the local control plane, installs the CRDs, applies the example
ResidentModel and shows it with ``kubectl get rm``. It grows into the full flow
(operator, bridge, owner, transitions) as those components land.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from .controlplane import REPO, ControlPlane

EXAMPLE = REPO / "examples" / "residentmodel.yaml"


def step(text: str) -> None:
    print(f"\n==> {text}", flush=True)


def run(keep: bool) -> int:
    step("starting a local control plane on 127.0.0.1 (first run builds Kubernetes from Debian sources)")
    began = time.monotonic()
    with ControlPlane() as cp:
        print(f"    kube-apiserver ready at {cp.server} in {time.monotonic() - began:.1f}s")
        step("installing the CRDs from crds/")
        for name in cp.install_crds():
            print(f"    {name}")
        step(f"applying {EXAMPLE.relative_to(REPO)}")
        print(cp.kubectl("apply", "-f", str(EXAMPLE)).stdout, end="")
        step("kubectl get rm")
        print(cp.kubectl("get", "rm", "-o", "wide").stdout, end="")
        if keep:
            step(f"cluster kept running; KUBECONFIG={cp.kubeconfig}; Ctrl-C stops it")
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass
        step("stopping every process the demo started")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/demo", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep", action="store_true",
                        help="keep the cluster running until Ctrl-C (prints its KUBECONFIG)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log every command run")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    return run(args.keep)


if __name__ == "__main__":
    sys.exit(main())
