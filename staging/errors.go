package staging

import "errors"

var (
	// ErrMismatch: the bytes read do not match the recorded checksum.
	ErrMismatch = errors.New("checksum mismatch")
	// ErrNoSpace: the scratch filesystem cannot hold what the shard needs.
	ErrNoSpace = errors.New("not enough scratch space")
	// ErrNetworkScratch: the scratch directory is not local storage.
	ErrNetworkScratch = errors.New("scratch is not local storage")
	// ErrConfig names a bad Config field.
	ErrConfig = errors.New("invalid staging config")
)
