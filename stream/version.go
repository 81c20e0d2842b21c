package stream

import (
	"runtime"
	"runtime/debug"
	"sync"
)

// Build names the build of shardpool running in this process. Worker
// reports, the coordinator's info and final.json carry its Version, so
// that a fleet running two builds side by side (an old worker left
// running after an upgrade) shows it, and a run's evidence says which
// build ended it.
type Build struct {
	// Version is the main module's version as the go command stamped it:
	// the release of a `go install ...@vX.Y.Z`, or, built in a git
	// checkout, a pseudo-version naming the commit, with "+dirty" when
	// the checkout had changes ("v0.0.0-20261203190911-a51ab6e14a17+dirty");
	// "dev" when it stamped none (GOFLAGS=-buildvcs=false, no git).
	Version  string `json:"version"`
	Revision string `json:"revision,omitempty"` // the whole commit hash, where stamped
	Modified bool   `json:"modified,omitempty"` // built from a checkout with changes
	Go       string `json:"go"`                 // the Go release it was built with
}

// ThisBuild is this process's Build, read once from its build information.
var ThisBuild = sync.OnceValue(func() Build {
	b := Build{Version: "dev", Go: runtime.Version()}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return b
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		b.Version = v
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Revision = s.Value
		case "vcs.modified":
			b.Modified = s.Value == "true"
		}
	}
	return b
})
