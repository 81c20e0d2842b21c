package main

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/shardpool/shardpool/stream"
)

// cmdVersion prints the build: its version (with the commit it was built
// from, where the build recorded one) and Go release.
func cmdVersion(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("version", "shardpool version [--json]", stderr)
	asJSON := fs.Bool("json", false, `print {"version", "revision", "modified", "go"} as JSON (docs/cli.md)`)
	if err := parseNone(fs, args); err != nil {
		return err
	}
	b := stream.ThisBuild()
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(b)
	}
	_, err := fmt.Fprintf(stdout, "shardpool %s (%s)\n", b.Version, b.Go)
	return err
}
