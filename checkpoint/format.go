package checkpoint

import (
	"encoding/json"
	"time"
)

// Names of the metadata files inside a committed directory.
const (
	ManifestName = "MANIFEST"
	MarkerName   = "COMPLETE"
	formatV      = 1
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

// Marker is the COMPLETE file: it vouches for the MANIFEST by checksum.
type Marker struct {
	V           int       `json:"v"`
	Generation  int64     `json:"generation"`
	Manifest    string    `json:"manifest_xxh64"`
	Owner       string    `json:"owner,omitempty"`
	Fingerprint string    `json:"fingerprint,omitempty"`
	Time        time.Time `json:"time"`
	Files       int       `json:"files"`
	Bytes       int64     `json:"bytes"`
}

// Options describe one commit.
type Options struct {
	// Owner and Fingerprint are recorded in the marker.
	Owner       string
	Fingerprint string
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
