package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
)

// Every command's --help names each flag's argument with a placeholder
// (FILE, DIR, URL, or the Go type of a plain number or duration), spelt
// as the docs and errors spell flags. A usage with back quotes around
// anything but its argument once printed "-token-file shardpool
// coordinator --data DATA".
func TestHelpNamesEveryFlagsArgument(t *testing.T) {
	commands := [][]string{{"run"}, {"coordinator"}, {"worker"}, {"submit"}, {"sbatch"}, {"status"}, {"forget"},
		{"profile"}, {"plan"}, {"stage"}, {"preflight"}, {"drill"},
		{"ckpt", "commit"}, {"ckpt", "latest"}, {"ckpt", "replicate"}, {"ckpt", "verify"}}
	flagLine := regexp.MustCompile(`^  (--[a-z][a-z0-9-]+|-[a-z])( ([A-Z][A-Z:=|_]*|[a-z]+\|[a-z|]+|int|duration))?$`)
	for _, c := range commands {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), append(c, "--help"), &stdout, &stderr)
		if err != errHelp {
			t.Fatalf("%s --help: %v, want the usage and exit 0\n%s", c, err, stderr.String())
		}
		help := stderr.String()
		if strings.Contains(help, "`") {
			t.Errorf("%s --help prints a back quote:\n%s", c, help)
		}
		flags := 0
		for _, line := range strings.Split(help, "\n") {
			if !strings.HasPrefix(line, "  -") {
				continue
			}
			flags++
			if !flagLine.MatchString(line) {
				t.Errorf("%s --help: flag line %q does not name its argument as a placeholder", c, line)
			}
		}
		if flags == 0 && c[len(c)-1] != "replicate" {
			t.Errorf("%s --help lists no flags:\n%s", c, help)
		}
	}
}
