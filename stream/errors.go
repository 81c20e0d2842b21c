package stream

import "errors"

var (
	// ErrInvalidSpec wraps every problem found in a run spec; the message names
	// the file, the line where known, and the field.
	ErrInvalidSpec = errors.New("invalid run spec")
	// ErrInvalidManifest wraps every problem found in a manifest line.
	ErrInvalidManifest = errors.New("invalid manifest")
	// ErrSchemaVersion means a stored value was written by a newer shardpool.
	ErrSchemaVersion = errors.New("unknown schema version")
	// ErrPlaceholder means a command placeholder cannot be expanded for a shard.
	ErrPlaceholder = errors.New("placeholder cannot be expanded")
	// ErrNotDurable means a sync barrier failed: what was written may not
	// survive a host crash, so the writer must not act on it yet.
	ErrNotDurable = errors.New("not yet durable")
)
