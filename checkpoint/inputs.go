package checkpoint

import (
	"fmt"
	"io/fs"
	"os"

	"github.com/cespare/xxhash/v2"
)

// InputsStamp identifies the state of a shard's inputs cheaply: xxhash64
// over each input's size and modification time (nanoseconds), in order.
// Their content is not read: hashing every input of every shard at each
// submission would cost as much as staging them. An input rewritten in
// place changes its modification time, and so its stamp. Paths are left
// out: the manifest names the inputs (and is in the fingerprint), and a
// project directory moved as a whole keeps its stamps. It is "" for a
// shard without inputs, and an error when an input cannot be looked at.
func InputsStamp(paths []string) (string, error) {
	infos := make([]fs.FileInfo, 0, len(paths))
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			return "", err
		}
		infos = append(infos, fi)
	}
	return StampOf(infos), nil
}

// StampOf is InputsStamp of inputs already looked at: their FileInfos, in
// the manifest's order ("" for none).
func StampOf(infos []fs.FileInfo) string {
	if len(infos) == 0 {
		return ""
	}
	h := xxhash.New()
	for _, fi := range infos {
		fmt.Fprintf(h, "%d\x00%d\n", fi.Size(), fi.ModTime().UnixNano())
	}
	return fmt.Sprintf("%016x", h.Sum64())
}

// InputsChanged reports whether the marker records inputs (Inputs) that
// differ from inputs as they stand now. Inputs it cannot look at are not
// taken for changed: whoever runs the shard checks them and says what is
// wrong.
func (m Marker) InputsChanged(inputs []string) bool {
	if m.Inputs == "" {
		return false
	}
	cur, err := InputsStamp(inputs)
	return err == nil && cur != m.Inputs
}
