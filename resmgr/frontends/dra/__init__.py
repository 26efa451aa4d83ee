"""cri-resmgr as a DRA driver of kubelet (docs/dra.md): the plugin registration and DRA node
services on unix sockets, beside whichever front end runs the containers."""
