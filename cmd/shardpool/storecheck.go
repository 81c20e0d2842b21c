package main

import (
	"context"
	"fmt"
	"io"

	"github.com/shardpool/shardpool/worker/probe"
)

// checkStore warns about a store on network storage (warnNetworkStore) or
// in memory (warnVolatile), as the host's own probe sees it.
func checkStore(ctx context.Context, store string, w io.Writer) {
	if pr, err := probe.New(probe.Config{}); err == nil {
		warnNetworkStore(ctx, pr, store, w)
		warnVolatile(ctx, pr, "the store "+store, store, "give --data a disk", w)
	}
}

// checkOutput warns (warnVolatile) about an output directory in memory.
// Its callers know the directory is there: `run` has made it, `submit`
// calls it only where this host has it.
func checkOutput(ctx context.Context, output string, w io.Writer) {
	if pr, err := probe.New(probe.Config{}); err == nil {
		warnVolatile(ctx, pr, "the output directory "+output, output, "set output in the spec to a directory on a disk", w)
	}
}

// warnVolatile says so when path is on a filesystem held in memory
// (tmpfs, ramfs: /dev/shm, a /tmp of some distributions). What is
// committed or stored there survives a crash of shardpool, which is what
// its fsyncs are for, but not a reboot or a power cut, and it takes the
// host's memory from the shards. what names the path for the user, fix
// says what to do.
func warnVolatile(ctx context.Context, pr *probe.Prober, what, path, fix string, w io.Writer) {
	pi := pr.Where(ctx, path)
	if pi.Type != "tmpfs" && pi.Type != "ramfs" {
		return
	}
	fmt.Fprintf(w, "warning: %s is on %s mounted at %s, held in memory: it is lost at a reboot or power cut, and what it holds takes memory from the shards; %s\n",
		what, pi.Type, pi.MountPoint, fix)
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
