package coordinator

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Live is a coordinator that holds a store under a state directory right
// now: `shardpool coordinator --data DIR` (store DIR/jetstream) or a
// `shardpool run` (store DIR/stores/<run>).
type Live struct {
	// Run names the run of a `shardpool run` store; empty for the
	// coordinator daemon's.
	Run string `json:"run,omitempty"`
	// Store is the store directory.
	Store string `json:"store"`
	// URL is the client URL it serves, as it wrote it once its listener
	// was up; empty while it starts.
	URL string `json:"url,omitempty"`
	// Holder is its lock file's first line ("pid N on HOST since T").
	Holder string `json:"holder"`
	// TokenFile holds the token its clients present; empty where the
	// store has none.
	TokenFile string `json:"token_file,omitempty"`
	// CAFile is the certificate authority clients pin where it serves
	// TLS; empty where it does not.
	CAFile string `json:"ca_file,omitempty"`
}

// LiveIn lists the coordinators that hold a store under the state
// directory dir, the daemon's first, then the runs' by name. A store is
// held while its lock file's flock is: the kernel drops it however its
// holder ends, so a killed coordinator is never listed. Looking takes a
// shared lock for a moment (lockData waits that out).
func LiveIn(dir string) ([]Live, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "stores", "*", lockName))
	if err != nil {
		return nil, err
	}
	sort.Strings(paths)
	paths = append([]string{filepath.Join(dir, "jetstream", lockName)}, paths...)
	var out []Live
	for _, p := range paths {
		held, data, err := lockHeld(p)
		if err != nil {
			return nil, fmt.Errorf("look for a coordinator in %s: %w", filepath.Dir(p), err)
		}
		if !held {
			continue
		}
		l := Live{Store: filepath.Dir(p)}
		if filepath.Base(filepath.Dir(l.Store)) == "stores" {
			l.Run = filepath.Base(l.Store)
		}
		if _, err := os.Stat(filepath.Join(l.Store, TokenName)); err == nil {
			l.TokenFile = filepath.Join(l.Store, TokenName)
		}
		for i, line := range strings.Split(strings.TrimSpace(data), "\n") {
			if i == 0 {
				l.Holder = line
			} else if u, ok := strings.CutPrefix(line, "url "); ok {
				l.URL = u
			} else if line == "tls" {
				l.CAFile = filepath.Join(l.Store, CAName)
			} else if t, ok := strings.CutPrefix(line, "token "); ok {
				l.TokenFile = t // --token-file: a cluster's shared one
			} else if f, ok := strings.CutPrefix(line, "ca "); ok {
				l.CAFile = f // beside a --token-file (written with "tls" only)
			}
		}
		out = append(out, l)
	}
	return out, nil
}

// lockHeld reports whether someone holds the lock file at path, and its
// content. A missing file is a store nobody ever held.
func lockHeld(path string) (bool, string, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, "", nil
	}
	if err != nil {
		return false, "", err
	}
	defer f.Close()
	data, _ := io.ReadAll(f)
	err = unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB)
	if errors.Is(err, unix.EWOULDBLOCK) {
		return true, string(data), nil
	}
	if err != nil {
		return false, "", err
	}
	_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
	return false, string(data), nil
}

// lockTries bounds how long lockData waits for a lock that LiveIn holds
// for a moment (a `status --data` looking while a run starts).
const (
	lockTries = 20
	lockPause = 10 * time.Millisecond
)

// sharedOnly reports whether the lock file at path is held by shared
// locks alone (someone looking), not by a coordinator.
func sharedOnly(path string) bool {
	held, _, err := lockHeld(path)
	return err == nil && !held
}
