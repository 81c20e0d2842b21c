package checkpoint

import (
	"fmt"
	"time"

	"github.com/cespare/xxhash/v2"
	json "github.com/segmentio/encoding/json"
)

// Names of the metadata files inside a committed directory. MANIFEST is
// written only by format 1; format 2 carries the file list in COMPLETE.
const (
	ManifestName = "MANIFEST"
	MarkerName   = "COMPLETE"
	// formatV is the format this package writes. Format 1 (a MANIFEST file
	// beside COMPLETE) is still read.
	formatV = 2
	// manifestV versions the file list whose checksum the marker records;
	// it is the same in both formats, so one content has one checksum.
	manifestV = 1
)

// File is one committed file; Path is slash-separated and relative.
type File struct {
	Path  string `json:"path"`
	Size  int64  `json:"size"`
	XXH64 string `json:"xxh64"`
	Mode  uint32 `json:"mode"`
}

type manifest struct {
	V     int    `json:"v"`
	Files []File `json:"files"`
}

// Marker is the COMPLETE file: it vouches for the file list (the
// manifest) by checksum. Format 2 carries the list itself in Contents;
// format 1 kept it in a MANIFEST file beside the marker. Manifest is the
// xxhash64 of the list's canonical JSON in both, so one content has one
// checksum whichever format committed it.
type Marker struct {
	V           int    `json:"v"`
	Generation  int64  `json:"generation"`
	Manifest    string `json:"manifest_xxh64"`
	Owner       string `json:"owner,omitempty"`
	Fingerprint string `json:"fingerprint,omitempty"`
	// Run names the shardpool run whose shard this output is (absent in
	// markers written before 2026-12-01, and in job checkpoints).
	Run string `json:"run,omitempty"`
	// Inputs is the shard's inputs as they stood when its command started
	// (InputsStamp: their sizes and modification times): an output made
	// from inputs that changed since is made again. Absent for a shard
	// without inputs, in job checkpoints, and in markers written before
	// 2026-12-02.
	Inputs   string    `json:"inputs_stamp,omitempty"`
	Time     time.Time `json:"time"`
	Files    int       `json:"files"`
	Bytes    int64     `json:"bytes"`
	Contents []File    `json:"contents,omitempty"`
}

// manifestBytes is the canonical JSON of a file list: the bytes whose
// checksum a marker records (and, in format 1, the MANIFEST file).
func manifestBytes(files []File) []byte {
	b, _ := jsonIndent(manifest{V: manifestV, Files: files})
	return b
}

// listChecksum is the checksum a marker records for its file list: what
// a commit writes and a format 2 verification recomputes.
func listChecksum(files []File) string {
	return fmt.Sprintf("%016x", xxhash.Sum64(manifestBytes(files)))
}

// Options describe one commit.
type Options struct {
	// Owner, Fingerprint, Run and Inputs are recorded in the marker.
	Owner       string
	Fingerprint string
	Run         string
	Inputs      string
	// Move lets the commit rename source files instead of copying them when
	// source and destination share a filesystem; the source is consumed.
	Move bool
	// Retain, for generations, is how many verified generations to keep
	// (zero keeps all).
	Retain int
	// Sync, when set, replaces the commit's per-file and per-directory
	// fsyncs (Prepare and Publish only): it is called once with the
	// temporary directory after everything is written, before the rename,
	// and once with the parent after the rename. It must make every write
	// made before the call under that path durable (for example one syncfs
	// of the file system, shared by concurrent commits). Nothing is visible
	// under the final name before the first call returned, so the marker
	// still never vouches for content that a crash could lose.
	Sync func(path string) error
}

func (m Marker) encode() []byte {
	b, _ := json.MarshalIndent(m, "", "  ")
	return append(b, '\n')
}
