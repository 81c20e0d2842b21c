package probe

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Statfs is what the probe needs from statfs(2).
type Statfs struct {
	Type   int64
	Bsize  int64
	Blocks uint64
	Bavail uint64
	Files  uint64
	Ffree  uint64
}

// StatFS reads filesystem statistics; the real one calls statfs(2).
type StatFS interface {
	Statfs(path string) (Statfs, error)
}

// SysStatFS is the real StatFS: statfs(2). A fixture that changes what one
// path reports can wrap it for the rest.
type SysStatFS struct{}

func (SysStatFS) Statfs(p string) (Statfs, error) {
	var s unix.Statfs_t
	if err := unix.Statfs(p, &s); err != nil {
		return Statfs{}, err
	}
	return Statfs{Type: int64(s.Type), Bsize: int64(s.Bsize), Blocks: s.Blocks, Bavail: s.Bavail, Files: s.Files, Ffree: s.Ffree}, nil
}

var _ StatFS = SysStatFS{}

// Free is the room an unprivileged writer has left on the file system
// (f_bavail blocks: root's reserve is not counted).
func (s Statfs) Free() int64 { return int64(s.Bavail) * s.Bsize }

// Total is the file system's size (f_blocks).
func (s Statfs) Total() int64 { return int64(s.Blocks) * s.Bsize }

// FreeBytes is Free of the file system that holds dir, by statfs(2).
func FreeBytes(dir string) (int64, error) {
	st, err := SysStatFS{}.Statfs(dir)
	return st.Free(), err
}

// Filesystem magic numbers from statfs(2) and the filesystems' sources.
var magics = map[int64]string{
	0x6969: "nfs", 0x517B: "smb", 0xFF534D42: "cifs", 0xFE534D42: "smb2",
	0x0BD00BD0: "lustre", 0x47504653: "gpfs", 0x19830326: "beegfs", 0x00C36400: "ceph",
	0x65735546: "fuse", 0x794C7630: "overlay", 0x01021994: "tmpfs", 0xEF53: "ext4",
	0x58465342: "xfs", 0x9123683E: "btrfs", 0x2FC12FC1: "zfs", 0x01021997: "9p",
	0x858458F6: "ramfs", 0x3153464A: "jfs", 0x52654973: "reiserfs", 0x4244: "hfs",
}

var networkTypes = map[string]bool{
	"nfs": true, "nfs4": true, "smb": true, "smb2": true, "smb3": true, "cifs": true, "lustre": true,
	"gpfs": true, "beegfs": true, "ceph": true, "9p": true, "glusterfs": true, "afs": true,
}

// Network FUSE filesystems by subtype; other FUSE subtypes are of unknown locality.
var networkFUSE = map[string]bool{
	"sshfs": true, "s3fs": true, "gcsfuse": true, "glusterfs": true, "ceph": true, "rclone": true,
	"goofys": true, "blobfuse": true, "blobfuse2": true, "juicefs": true, "cvmfs": true, "davfs": true,
	"mount-s3": true, "geesefs": true, "lxcfs": false,
}

// Locality of a path's filesystem.
const (
	Local   = "local"
	Network = "network"
	Unsure  = "unknown"
)

// PathInfo is one named path's storage.
type PathInfo struct {
	Name       string `json:"name"`
	Path       string `json:"path"`
	Resolved   string `json:"resolved"`
	Type       string `json:"type"`
	Subtype    string `json:"subtype,omitempty"`
	Locality   string `json:"locality"`
	MountPoint string `json:"mount_point,omitempty"`
	Source     string `json:"mount_source,omitempty"`
	BytesFree  Value  `json:"bytes_free"`
	BytesTotal Value  `json:"bytes_total"`
	InodesFree Value  `json:"inodes_free"`
	Unknown    string `json:"unknown,omitempty"`
	// Missing is set when the path does not exist (yet).
	Missing bool `json:"missing,omitempty"`
}

// FSType is the file system's type with its FUSE subtype
// ("fuse.sshfs").
func (pi PathInfo) FSType() string {
	if pi.Subtype != "" {
		return pi.Type + "." + pi.Subtype
	}
	return pi.Type
}

// Mount describes the mount that holds the path ("nfs4 fs1:/export/home
// mounted at /home"), or its type alone where no mount was found: what
// tells one file system from another at the same place, a remount of
// the same one from a mount gone.
func (pi PathInfo) Mount() string {
	if pi.MountPoint == "" {
		return pi.FSType()
	}
	return fmt.Sprintf("%s %s mounted at %s", pi.FSType(), pi.Source, pi.MountPoint)
}

// Where probes only the storage that holds path (mountinfo, symlinks,
// statfs under the deadline), without the rest of a Snapshot. A path that
// does not exist yet is judged by the nearest directory above it that
// does; the PathInfo returned is that directory's.
func (p *Prober) Where(ctx context.Context, path string) PathInfo {
	mounts, _ := p.mounts() // unreadable: the type rests on statfs, as in Snapshot
	pi := p.onePath(ctx, mounts, "path", path)
	for dir := filepath.Dir(path); pi.Missing && dir != "/" && dir != "."; dir = filepath.Dir(dir) {
		pi = p.onePath(ctx, mounts, "path", dir)
	}
	return pi
}

// storage probes each named path under the deadline.
func (p *Prober) storage(ctx context.Context, mounts []Mount, paths map[string]string) []PathInfo {
	out := make([]PathInfo, 0, len(paths))
	for _, n := range slices.Sorted(maps.Keys(paths)) {
		out = append(out, p.onePath(ctx, mounts, n, paths[n]))
	}
	return out
}

func (p *Prober) onePath(ctx context.Context, mounts []Mount, name, raw string) PathInfo {
	pi := PathInfo{Name: name, Path: raw, Type: "unknown", Locality: Unsure}
	type res struct {
		resolved string
		st       Statfs
		err      error
	}
	ch := make(chan res, 1)
	go func() {
		// May block forever on a dead network mount; the channel is buffered
		// so this goroutine can finish whenever the kernel lets it.
		r, err := filepath.EvalSymlinks(p.hostPath(raw))
		if err != nil {
			ch <- res{err: err}
			return
		}
		st, err := p.cfg.StatFS.Statfs(r)
		ch <- res{resolved: r, st: st, err: err}
	}()
	var r res
	select {
	case r = <-ch:
	case <-time.After(p.cfg.PathTimeout):
		pi.Unknown = fmt.Sprintf("no answer within %s (a hung network mount?)", p.cfg.PathTimeout)
		pi.BytesFree, pi.BytesTotal, pi.InodesFree = Unknown("statfs", "%s", pi.Unknown), Unknown("statfs", "%s", pi.Unknown), Unknown("statfs", "%s", pi.Unknown)
		return pi
	case <-ctx.Done():
		pi.Unknown = ctx.Err().Error()
		pi.BytesFree, pi.BytesTotal, pi.InodesFree = Unknown("statfs", "%s", pi.Unknown), Unknown("statfs", "%s", pi.Unknown), Unknown("statfs", "%s", pi.Unknown)
		return pi
	}
	if r.err != nil {
		pi.Missing = errors.Is(r.err, fs.ErrNotExist)
		pi.Unknown = r.err.Error()
		pi.BytesFree, pi.BytesTotal, pi.InodesFree = Unknown("statfs", "%v", r.err), Unknown("statfs", "%v", r.err), Unknown("statfs", "%v", r.err)
		return pi
	}
	pi.Resolved = p.guestPath(r.resolved)
	if m, ok := mountFor(mounts, pi.Resolved); ok {
		pi.MountPoint, pi.Source, pi.Type = m.Point, m.Source, m.FSType
		if base, sub, isFuse := strings.Cut(m.FSType, "."); isFuse && (base == "fuse" || base == "fuseblk") {
			pi.Type, pi.Subtype = "fuse", sub
		}
	}
	if t, ok := magics[r.st.Type]; ok {
		if !(t == "fuse" && pi.Type == "fuse") && !(t == "nfs" && strings.HasPrefix(pi.Type, "nfs")) {
			pi.Type = t
		}
	} else if pi.Type == "unknown" {
		pi.Type = fmt.Sprintf("magic 0x%x", r.st.Type)
	}
	pi.Locality = locality(pi.Type, pi.Subtype)
	src := "statfs " + pi.Resolved
	pi.BytesFree, pi.BytesTotal = Known(r.st.Free(), src), Known(r.st.Total(), src)
	if r.st.Files == 0 {
		pi.InodesFree = Unlimited(src + " (filesystem does not count inodes)")
	} else {
		pi.InodesFree = Known(int64(r.st.Ffree), src)
	}
	return pi
}

func locality(typ, sub string) string {
	switch {
	case networkTypes[typ]:
		return Network
	case typ == "fuse":
		if isNet, known := networkFUSE[sub]; known {
			if isNet {
				return Network
			}
			return Local
		}
		return Unsure
	case strings.HasPrefix(typ, "magic "), typ == "unknown":
		return Unsure
	}
	return Local
}
