package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker"
	"github.com/shardpool/shardpool/worker/probe"
)

// magicStatFS answers statfs with the file system type of the fixture
// mount that holds the path, as the kernel would.
type magicStatFS map[string]int64

func (m magicStatFS) Statfs(p string) (probe.Statfs, error) {
	for point, magic := range m {
		if strings.Contains(p, point) {
			return probe.Statfs{Type: magic, Bsize: 4096, Blocks: 1 << 20, Bavail: 1 << 19, Files: 1 << 16, Ffree: 1 << 15}, nil
		}
	}
	return probe.Statfs{Type: 0xEF53, Bsize: 4096, Blocks: 1 << 20, Bavail: 1 << 19}, nil
}

var _ probe.StatFS = magicStatFS(nil)

// fixtureProber probes the fixture host of worker/probe/testdata/v2 (a
// real machine's mountinfo, /home on NFSv4 and /scratch on XFS), with
// more mounts' types in more.
func fixtureProber(t *testing.T, more magicStatFS) *probe.Prober {
	t.Helper()
	root, err := filepath.Abs("../../worker/probe/testdata/v2")
	if err != nil {
		t.Fatal(err)
	}
	magic := magicStatFS{"/home": 0x6969, "/scratch": 0x58465342}
	for k, v := range more {
		magic[k] = v
	}
	pr, err := probe.New(probe.Config{Root: root, StatFS: magic})
	if err != nil {
		t.Fatal(err)
	}
	return pr
}

// TestNetworkStoreIsWarnedAbout: a store under an NFS home directory (the
// default state directory of a cluster user) gets a warning that names the
// mount and says what to do; one on local disk gets none. The host is a
// fixture whose mountinfo comes from a real machine with /home on NFSv4.
func TestNetworkStoreIsWarnedAbout(t *testing.T) {
	pr := fixtureProber(t, nil)
	ctx := context.Background()
	var b strings.Builder
	warnNetworkStore(ctx, pr, "/home/alice/.local/state/shardpool/stores/r", &b)
	for _, want := range []string{"the store /home/alice/.local/state/shardpool/stores/r is on network storage", "nfs4", "fs1:/export/home", "mounted at /home", "give --data a local disk"} {
		if !strings.Contains(b.String(), want) {
			t.Fatalf("warning %q lacks %q", b.String(), want)
		}
	}
	b.Reset()
	warnNetworkStore(ctx, pr, "/scratch/alice/shardpool/stores/r", &b)
	if b.Len() != 0 {
		t.Fatalf("store on local xfs: got warning %q, want none", b.String())
	}
}

// TestVolatileStoreAndOutputAreWarnedAbout: a store or output directory on
// tmpfs (/dev/shm of the fixture, a real machine's mountinfo) gets a
// warning that it is lost at a reboot, naming the mount and what to
// change; one on local disk or on NFS (an output's usual place) gets none.
func TestVolatileStoreAndOutputAreWarnedAbout(t *testing.T) {
	pr := fixtureProber(t, magicStatFS{"/dev/shm": 0x01021994})
	ctx := context.Background()
	for _, c := range []struct {
		what, path, fix string
		want            []string
	}{
		{"the store /dev/shm/st/stores/r", "/dev/shm/st/stores/r", "give --data a disk",
			[]string{"warning: the store /dev/shm/st/stores/r is on tmpfs mounted at /dev/shm", "lost at a reboot", "give --data a disk"}},
		{"the output directory /dev/shm/out", "/dev/shm/out", "set output in the spec to a directory on a disk",
			[]string{"warning: the output directory /dev/shm/out is on tmpfs", "set output in the spec"}},
		{"the output directory /scratch/out", "/scratch/out", "x", nil},
		{"the output directory /home/alice/out", "/home/alice/out", "x", nil},
	} {
		var b strings.Builder
		warnVolatile(ctx, pr, c.what, c.path, c.fix, &b)
		if c.want == nil && b.Len() != 0 {
			t.Errorf("%s: got warning %q, want none", c.path, b.String())
		}
		for _, want := range c.want {
			if !strings.Contains(b.String(), want) {
				t.Errorf("%s: warning %q lacks %q", c.path, b.String(), want)
			}
		}
	}
}

// TestNetworkInputsAreNoted: shards that read inputs on NFS in place (the
// fixture's /home, a real machine's mountinfo) get a note that names the
// mount and the setting that stages them; shards that stage, and inputs
// on local disk, get none. Only the shards with inputs that do not stage
// are counted (e has none, d's class stages), and the tables named are
// their classes'.
func TestNetworkInputsAreNoted(t *testing.T) {
	pr := fixtureProber(t, nil)
	yes := true
	man := &stream.Manifest{Shards: []stream.Shard{
		{ID: "a", Class: "cpu", Inputs: []string{"/scratch/alice/in/a.txt", "/home/alice/in/a.txt"}},
		{ID: "b", Class: "cpu", Inputs: []string{"/scratch/alice/in/b.txt"}},
		{ID: "c", Class: "gpu", Inputs: []string{"/home/alice/in/c.txt"}},
		{ID: "d", Class: "big", Inputs: []string{"/home/alice/in/d.txt"}},
		{ID: "e", Class: "cpu"},
	}}
	spec := &stream.Spec{Classes: map[string]stream.Class{"big": {Stage: &yes}}}
	ctx := context.Background()
	var b strings.Builder
	warnNetworkInputs(ctx, pr, spec, man, &b)
	for _, want := range []string{"note: 2 of 3 shard(s) that do not stage read inputs on network storage", "nfs4", "fs1:/export/home", "mounted at /home",
		"set stage = true in the spec, or in [class.cpu] or [class.gpu],"} {
		if !strings.Contains(b.String(), want) {
			t.Fatalf("note %q lacks %q", b.String(), want)
		}
	}
	for _, c := range []struct {
		what string
		spec *stream.Spec
		man  *stream.Manifest
	}{
		{"every class stages", &stream.Spec{Stage: true}, man},
		{"inputs on local disk", &stream.Spec{}, &stream.Manifest{Shards: []stream.Shard{{ID: "b", Class: "cpu", Inputs: []string{"/scratch/alice/in/b.txt"}}}}},
	} {
		b.Reset()
		warnNetworkInputs(ctx, pr, c.spec, c.man, &b)
		if b.Len() != 0 {
			t.Errorf("%s: got %q, want no note", c.what, b.String())
		}
	}
}

// TestOutputStorageIsRecorded: what `submit` records of the output
// directory (worker.OutputStorageOf) on a fixture host with /home on
// NFSv4 and /scratch on a local disk: under /home the mount, from the
// nearest directory that exists where the output does not yet; under
// /scratch the local disk with the host's boot ID, which tells workers on
// other hosts that it is not theirs; nothing there where the boot ID is
// not known, since then no worker could tell.
func TestOutputStorageIsRecorded(t *testing.T) {
	pr := fixtureProber(t, nil)
	ctx := context.Background()
	got := worker.OutputStorageOf(ctx, pr, "login1", "b-1", "/home/alice/results/run-7")
	want := stream.OutputStorage{Host: "login1", Type: "nfs4", Source: "fs1:/export/home", MountPoint: "/home"}
	if got == nil || *got != want {
		t.Fatalf("output under /home: %+v, want %+v", got, want)
	}
	got = worker.OutputStorageOf(ctx, pr, "login1", "b-1", "/scratch/alice/results")
	if got == nil || !got.Local || got.BootID != "b-1" || got.Type != "xfs" || got.MountPoint != "/scratch" || got.Host != "login1" {
		t.Errorf("output on local xfs: %+v, want it recorded as login1's local disk of boot b-1", got)
	}
	if got := worker.OutputStorageOf(ctx, pr, "login1", "unknown", "/scratch/alice/results"); got != nil {
		t.Errorf("output on local xfs, boot not known: %+v, want nothing recorded", got)
	}
}
