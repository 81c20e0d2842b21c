package checkpoint

import "errors"

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
