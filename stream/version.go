package stream

import (
	_ "embed"
	"encoding/hex"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"
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
	// Built from a `git archive` (a release tarball) without git, the
	// same pseudo-version, from archive.txt. "dev" when none of these
	// names the build (GOFLAGS=-buildvcs=false in a checkout, a copy of
	// the files).
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
	if rev, v, ok := fromArchive(archived); ok && b.Version == "dev" && b.Revision == "" {
		b.Revision, b.Version = rev, v
	}
	return b
})

// archived is archive.txt: "$Format:%H %ct$" in a checkout, where git
// archive (.gitattributes: export-subst) writes the commit's hash and
// its committer time. Without it a build from a release tarball, which
// has no .git for the go command to read, said "dev".
//
//go:embed archive.txt
var archived string

// fromArchive is the commit and its pseudo-version (as the go command
// names a commit: v0.0.0-UTCTIME-HASH12) that git archive wrote into
// archive.txt; ok is false for the placeholder of a checkout.
func fromArchive(s string) (rev, version string, ok bool) {
	f := strings.Fields(s)
	if len(f) != 2 || len(f[0]) != 40 {
		return "", "", false
	}
	if _, err := hex.DecodeString(f[0]); err != nil {
		return "", "", false
	}
	sec, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return "", "", false
	}
	return f[0], "v0.0.0-" + time.Unix(sec, 0).UTC().Format("20060102150405") + "-" + f[0][:12], true
}
