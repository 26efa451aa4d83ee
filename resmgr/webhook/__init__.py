"""cri-resmgr-webhook: a mutating admission webhook that copies each container's resource
requests and limits from the pod spec into the `intel.com/resources` annotation, which
reaches the node through CRI and tells the policies what the pod really asked for."""
