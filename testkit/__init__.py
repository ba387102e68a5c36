"""The test seam: code that exists only so tests, benchmarks and demos can drive the real
components, kept outside every package the image installs.

The image is the project's wheel (``localcluster/wheel_layer.py``), and the wheel holds
only the packages ``pyproject.toml`` lists under ``[tool.setuptools.packages.find]``:
``bundle``, ``csi_bridge``, ``owner``, ``resident_operator`` and ``localcluster``. This
package is not among them, so nothing here ships; it is imported with the repository
root on ``sys.path`` (the tests' ``PYTHONPATH``, the experiments' ``sys.path.insert``).
A unit test (tests/unit/test_testkit_seam.py) checks both directions: the wheel's package
list leaves ``testkit`` out, and no installed package imports it.

- :mod:`testkit.bridge`: real bundles on disk, the bridge as a child process, a CSI
  client over its unix socket, unmounting what a test left;
- :mod:`testkit.crash_points`: runs the bridge with one named crash point armed, so a
  test can kill it at an exact step (the production side is ``csi_bridge/checkpoints.py``);
- :mod:`testkit.local_volume`: a bundle volume laid out on local disk the way the bridge
  publishes one, for running an owner without the bridge;
- :mod:`testkit.s3_server`: a real S3-compatible server (SeaweedFS) on 127.0.0.1.
- :mod:`testkit.prometheus_server`: Debian's Prometheus on 127.0.0.1, with a configuration
  of the test's;
- :mod:`testkit.pod_discovery`: Pods as HTTP service discovery, labelled as Prometheus'
  Kubernetes discovery labels them (Debian's build has none).
"""
