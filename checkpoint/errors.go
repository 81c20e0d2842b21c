package checkpoint

import (
	"errors"

	"golang.org/x/sys/unix"
)

var (
	// ErrIncomplete: the directory has no COMPLETE marker (an interrupted commit).
	ErrIncomplete = errors.New("no COMPLETE marker")
	// ErrCorrupt: a file, the file list or the marker does not match what was committed.
	ErrCorrupt = errors.New("checksum or size mismatch")
	// ErrUnsafe: the source holds something that cannot be committed safely
	// (a symlink, a device, a reserved name).
	ErrUnsafe = errors.New("unsafe output")
	// ErrNoGeneration: no generation in the directory verifies.
	ErrNoGeneration = errors.New("no verified generation")
	// ErrConflict: another committer took the same generation number.
	ErrConflict = errors.New("generation taken by another committer")
	// ErrEmpty means a checkpoint generation would hold no file.
	ErrEmpty = errors.New("nothing to commit")
)

// RoomError is a commit that failed for want of room in the destination's
// file system: full (ENOSPC, blocks or inodes) or over a quota (EDQUOT).
// It says what the commit needed there, so that a caller can wait for
// that much room instead of running the job again to fail the same.
type RoomError struct {
	Dir   string // the directory the commit wrote into
	Bytes int64  // what the commit needed: its files' sizes in 4 KiB blocks, and its marker
	Files int    // its files and directories
	Err   error
}

// Error is the file system's error as it came: the caller says what was
// needed, in its own units.
func (e *RoomError) Error() string { return e.Err.Error() }

func (e *RoomError) Unwrap() error { return e.Err }

// IsNoRoom reports whether err says a file system is full or a quota
// reached.
func IsNoRoom(err error) bool {
	return errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT)
}

// noRoom wraps err in a RoomError where it is one of no room; others are
// returned as they are.
func noRoom(err error, dir string, bytes int64, files int) error {
	var re *RoomError
	if !IsNoRoom(err) || errors.As(err, &re) {
		return err
	}
	return &RoomError{Dir: dir, Bytes: bytes, Files: files, Err: err}
}

// NoRoom is noRoom for a caller that failed to publish a commit of
// marker mk into dir (a rename that needed a directory block).
func NoRoom(err error, dir string, mk Marker) error {
	return noRoom(err, dir, roundBlock(mk.Bytes)+markerRoom, mk.Files)
}

// markerRoom is what a commit's marker and directories are counted at,
// beside its files.
const markerRoom = 64 << 10

// roundBlock rounds n up to whole 4 KiB blocks.
func roundBlock(n int64) int64 { return (n + 4095) &^ 4095 }

// needOf is what committing files and dirs takes of a file system, about:
// each file in whole 4 KiB blocks, a block per directory, and the marker.
func needOf(files []entry, dirs []string) int64 {
	n := int64(markerRoom) + int64(len(dirs))*4096
	for _, f := range files {
		n += roundBlock(f.size)
	}
	return n
}
