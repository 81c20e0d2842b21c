package coordinator

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"golang.org/x/sys/unix"

	"github.com/shardpool/shardpool/checkpoint"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker/probe"
)

// storeLimit is the JetStream store limit for the store at dir: what it
// holds already plus three quarters of the file system's free space.
// nats-server's own default is three quarters of the free space alone,
// taken at start: after a disk had filled, a restarted coordinator whose
// store outgrew that refused every write until far more was freed than the
// run needed. The quarter kept free stays the margin: a store that reaches
// its limit refuses writes (insufficient resources) instead of meeting a
// full disk, on which nats-server disables JetStream altogether.
func storeLimit(dir string) (int64, error) {
	free, err := probe.FreeBytes(dir)
	if err != nil {
		return 0, fmt.Errorf("free space of %s: %w", dir, err)
	}
	var used int64
	err = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		if info, err := d.Info(); err == nil {
			used += info.Size()
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return limitFor(used, free), nil
}

// limitFor is the store limit for a store holding used bytes on a file
// system with free bytes left (storeLimit's rule).
func limitFor(used, free int64) int64 { return used + free/4*3 }

// storeRoom is one look at the store: the free space of its file system
// (-1 when unreadable), JetStream's stored bytes and limit (limit 0 when
// unknown), and whether its file system refuses writes.
type storeRoom struct {
	free, used, limit int64
	// readOnly: a directory made in the store's directory failed with
	// EROFS, a file system remounted read-only after an error, which the
	// free space does not show, and which since Linux 6.12 (ext4's
	// errors=remount-ro) the mount does not either. nats-server then
	// fails what it writes with errors that do not all say so (a
	// consumer's creation: "error creating store for consumer").
	readOnly bool
}

// lookAtStore takes one look at the store, which a tick of watchStore
// shares among its checks.
func (c *Coordinator) lookAtStore() storeRoom {
	r := storeRoom{free: -1}
	if free, err := probe.FreeBytes(c.cfg.StoreDir); err == nil {
		r.free = free
	}
	r.readOnly = errors.Is(checkpoint.Writable(c.cfg.StoreDir), unix.EROFS)
	if js, err := c.srv.Jsz(&server.JSzOptions{}); err == nil && js != nil && js.Config.MaxStore > 0 {
		r.used, r.limit = int64(js.Store), js.Config.MaxStore
	}
	return r
}

// storeFloor is how close to its limit (or to a full file system) the
// store may come before the coordinator says it is full: writes of a
// record or two fit in it, a run's next thousand shards do not.
const storeFloor = 1 << 20

// StoreFull reports why the store refuses writes, or "" while it has room.
// Runs cannot go on meanwhile: workers cannot record or lease a shard.
func (c *Coordinator) StoreFull() string {
	if p, ok := c.storeFull.Load().(string); ok {
		return p
	}
	return ""
}

// noteWriteError keeps the first write error nats-server's file store
// logs ("Critical write error: ... no space left on device"). From then on
// that stream refuses every write, also once space is freed (measured with
// nats-server 2.15: docs/decisions.md, "A full store"), until the store is
// loaded again by a new server.
func (c *Coordinator) noteWriteError(msg string) {
	_, why, ok := strings.Cut(msg, "Critical write error: ")
	if !ok {
		return
	}
	if c.writeErr.CompareAndSwap(nil, why) {
		c.log.Error("store write failed: it takes no more writes until the coordinator restarts", "store", c.cfg.StoreDir, "err", why,
			"reload", c.cfg.ReloadOnWriteError)
	}
}

// writeError is the store's first write error, or "".
func (c *Coordinator) writeError() string {
	s, _ := c.writeErr.Load().(string)
	return s
}

// reloadRoom is the free space a store that met a write error waits for
// before a coordinator with ReloadOnWriteError reloads it.
const reloadRoom = 4 * storeFloor

// watchStore checks the store's room every interval and logs a change of
// StoreFull. With ReloadOnWriteError it returns ErrReload once a store
// that met a write error has room again.
func (c *Coordinator) watchStore(ctx context.Context, every time.Duration) error {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		room := c.lookAtStore()
		if c.cfg.ReloadOnWriteError && c.writeError() != "" && room.free >= reloadRoom && !room.readOnly {
			c.log.Warn("the store has room again: reloading it", "store", c.cfg.StoreDir, "free", stream.FormatSize(room.free))
			return ErrReload
		}
		if c.raiseStoreLimit(room) {
			room = c.lookAtStore()
		}
		why := c.checkStore(room)
		if why == c.StoreFull() {
			continue
		}
		c.storeFull.Store(why)
		if why != "" {
			c.log.Error("store takes no writes: runs cannot go on", "store", c.cfg.StoreDir, "why", why)
		} else {
			c.log.Info("store takes writes again", "store", c.cfg.StoreDir)
		}
	}
}

// raiseNear is how close to its limit the store must come before the
// coordinator looks whether the file system now has room for a higher one.
const raiseNear = 8 * storeFloor

// raiseStoreLimit raises JetStream's store limit, without a restart, when
// the store has come near it and its file system has room for more than
// the limit allows now: a limit is set from the free space at start, and
// space freed since (or never needed by other users) would otherwise stay
// out of reach until a restart. The new limit follows storeLimit's rule
// (limitFor); nats-server takes an increase on reload, never a decrease.
// It reports whether it raised the limit.
func (c *Coordinator) raiseStoreLimit(room storeRoom) bool {
	if room.limit <= 0 || room.free < 0 || room.used <= room.limit-raiseNear {
		return false
	}
	next := limitFor(room.used, room.free)
	if next < room.limit+raiseNear {
		return false
	}
	opts := c.opts.Clone()
	opts.JetStreamMaxStore = next
	if err := c.srv.ReloadOptions(opts); err != nil {
		c.log.Warn("raise the store limit", "store", c.cfg.StoreDir, "limit", stream.FormatSize(room.limit), "to", stream.FormatSize(next), "err", err)
		return false
	}
	c.opts.JetStreamMaxStore = next
	c.log.Info("raised the store limit: its file system has room again", "store", c.cfg.StoreDir,
		"holds", stream.FormatSize(room.used), "limit", stream.FormatSize(room.limit), "to", stream.FormatSize(next))
	return true
}

// checkStore says why the store has no room, or "".
func (c *Coordinator) checkStore(room storeRoom) string {
	var why []string
	if room.readOnly {
		// Not the probe's own error: its name changes at each look, and a
		// reason that changes is logged again.
		why = append(why, fmt.Sprintf("the file system of %s refuses writes: %v", c.cfg.StoreDir, unix.EROFS))
	}
	if room.free >= 0 && room.free < storeFloor {
		why = append(why, fmt.Sprintf("the file system of %s has %s free", c.cfg.StoreDir, stream.FormatSize(room.free)))
	}
	if werr := c.writeError(); werr != "" {
		then := "until the coordinator restarts"
		if c.cfg.ReloadOnWriteError {
			then = fmt.Sprintf("until it is reloaded, which the coordinator does once %s has %s free", c.cfg.StoreDir, stream.FormatSize(reloadRoom))
		}
		why = append(why, fmt.Sprintf("a write to the store failed (%s): it takes no writes %s", werr, then))
	}
	if len(why) > 0 {
		return strings.Join(why, "; ")
	}
	if room.limit > 0 && room.used > room.limit-storeFloor {
		return fmt.Sprintf("the store %s holds %s of its limit of %s (what it held plus three quarters of the space free when the limit was set)",
			c.cfg.StoreDir, stream.FormatSize(room.used), stream.FormatSize(room.limit))
	}
	return ""
}
