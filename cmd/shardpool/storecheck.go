package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker"
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

// checkInputs says so (warnNetworkInputs) when shards read inputs on
// network storage in place.
func checkInputs(ctx context.Context, spec *stream.Spec, man *stream.Manifest, w io.Writer) {
	if pr, err := probe.New(probe.Config{}); err == nil {
		warnNetworkInputs(ctx, pr, spec, man, w)
	}
}

// Bounds of warnNetworkInputs: input directories probed, and the time
// all of them may take (a hung mount answers no statfs).
const (
	inputDirsProbed = 256
	inputProbeTime  = 2 * time.Second
)

// warnNetworkInputs says so when shards whose class does not stage read
// inputs on network storage, as this host's probe sees their
// directories: each attempt reads them from the server, on every host
// at once, which is what staging is for (copied to local scratch first,
// checksummed, kept for later attempts). Staging is off by default, and
// a user with inputs on NFS would otherwise learn of it only from a slow
// run. At most inputDirsProbed directories are looked at, within
// inputProbeTime; storage of unknown locality says nothing.
func warnNetworkInputs(ctx context.Context, pr *probe.Prober, spec *stream.Spec, man *stream.Manifest, w io.Writer) {
	ctx, cancel := context.WithTimeout(ctx, inputProbeTime)
	defer cancel()
	probed := map[string]*probe.PathInfo{} // input directory: its storage where network, else nil
	var first *probe.PathInfo
	n, of, cut := 0, 0, false
	classes := map[string]bool{}
	for _, sh := range man.Shards {
		if spec.StageFor(sh.Class) || len(sh.Inputs) == 0 {
			continue
		}
		of++
		for _, in := range sh.Inputs {
			dir := filepath.Dir(in)
			pi, ok := probed[dir]
			if !ok {
				if len(probed) >= inputDirsProbed || ctx.Err() != nil {
					cut = true
					continue
				}
				if got := pr.Where(ctx, dir); got.Locality == probe.Network {
					pi = &got
				}
				probed[dir] = pi
			}
			if pi != nil {
				n++
				classes[sh.Class] = true
				if first == nil {
					first = pi
				}
				break
			}
		}
	}
	if n == 0 {
		return
	}
	count := fmt.Sprintf("%d of %d", n, of)
	if cut {
		count = fmt.Sprintf("at least %d of %d", n, of)
	}
	tables := make([]string, 0, len(classes))
	for _, c := range slices.Sorted(maps.Keys(classes)) {
		tables = append(tables, "[class."+c+"]")
	}
	fmt.Fprintf(w, "note: %s shard(s) that do not stage read inputs on network storage (%s, %s mounted at %s): each attempt reads them from the server, every host at once; set stage = true in the spec, or in %s, to copy them to local scratch first (checksummed, kept for later attempts)\n",
		count, first.FSType(), first.Source, first.MountPoint, strings.Join(tables, " or "))
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
	fmt.Fprintf(w, "warning: the store %s is on network storage (%s, %s mounted at %s): every sync waits for the server, and the lock that keeps a second coordinator off the store may not hold between hosts; give --data a local disk\n",
		store, pi.FSType(), pi.Source, pi.MountPoint)
}

// outputStorage is where this host sees the run's output directory, for
// the run record (worker.OutputStorageOf): nil where the probe cannot tell
// within inputProbeTime.
func outputStorage(ctx context.Context, out string) *stream.OutputStorage {
	pr, err := probe.New(probe.Config{})
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, inputProbeTime)
	defer cancel()
	host, _ := os.Hostname()
	return worker.OutputStorageOf(ctx, pr, host, stream.BootID("/proc"), out)
}
