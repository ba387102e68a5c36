"""Generated gRPC stubs of kubelet's device-plugin API (see deviceplugin.proto)."""
