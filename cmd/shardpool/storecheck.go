package main

import (
	"context"
	"fmt"
	"io"

	"github.com/shardpool/shardpool/worker/probe"
)

// checkStore warns (warnNetworkStore) about a store on network storage,
// as the host's own probe sees it.
func checkStore(ctx context.Context, store string, w io.Writer) {
	if pr, err := probe.New(probe.Config{}); err == nil {
		warnNetworkStore(ctx, pr, store, w)
	}
}

// warnNetworkStore says so when a coordinator's store directory is on
// network storage. JetStream's file store there is slow (every barrier a
// round trip to the server), the lock that keeps a second coordinator off
// the store may not hold between hosts, and the default state directory
// sits in the home directory, which clusters often serve over NFS.
// Storage of unknown locality says nothing: it is usually local.
func warnNetworkStore(ctx context.Context, pr *probe.Prober, store string, w io.Writer) {
	pi := pr.Where(ctx, store)
	if pi.Locality != probe.Network {
		return
	}
	typ := pi.Type
	if pi.Subtype != "" {
		typ += "." + pi.Subtype
	}
	fmt.Fprintf(w, "warning: the store %s is on network storage (%s, %s mounted at %s): every sync waits for the server, and the lock that keeps a second coordinator off the store may not hold between hosts; give --data a local disk\n",
		store, typ, pi.Source, pi.MountPoint)
}
