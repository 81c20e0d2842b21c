package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
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

// TestBadFlagKeepsItsErrorInSight: a bad flag prints its error, the
// command's synopsis and where the flags are listed, not the forty lines
// of flags under which the error would scroll away; --help still lists
// them.
func TestBadFlagKeepsItsErrorInSight(t *testing.T) {
	for _, c := range []struct {
		args []string
		err  string
	}{
		{[]string{"worker", "--slots", "0"}, `invalid value "0" for flag -slots`},
		{[]string{"worker", "--grace", "-1s"}, `invalid value "-1s" for flag -grace: want a duration of 0 or more`},
		{[]string{"run", "--lease-ttl", "-5s", "x.toml"}, `invalid value "-5s" for flag -lease-ttl: want a duration of 0 or more`},
		{[]string{"worker", "--stage-concurrency", "0"}, `invalid value "0" for flag -stage-concurrency: 0: want at least 1`},
		{[]string{"run", "--stage-concurrency", "-1", "x.toml"}, `invalid value "-1" for flag -stage-concurrency: -1: want at least 1`},
		{[]string{"stage", "--stage-fleet", "-2", "x.toml"}, `invalid value "-2" for flag -stage-fleet: -2: want a number of copies, or 0 for no fleet-wide bound`},
		{[]string{"run", "--colour", "x.toml"}, "flag provided but not defined: -colour"},
		{[]string{"status", "--json=maybe"}, "invalid boolean value"},
		{[]string{"run", "a.toml", "b.toml"}, "shardpool run: takes 1 argument, got 2: a.toml b.toml"},
		{[]string{"preflight", "extra"}, "shardpool preflight: takes no argument, got 1: extra"},
	} {
		args := c.args
		var stdout, stderr bytes.Buffer
		if err := run(context.Background(), args, &stdout, &stderr); err != errUsage {
			t.Fatalf("%v: %v, want a usage error", args, err)
		}
		out := stderr.String()
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 3 || !strings.Contains(lines[0], c.err) || !strings.HasPrefix(lines[1], "Usage: shardpool "+args[0]) || lines[2] != "shardpool "+args[0]+" --help lists its flags" || strings.Contains(out, "Flags:") {
			t.Errorf("%v: got\n%s\nwant the error, the synopsis and where the flags are listed", args, out)
		}
	}
}

// TestCkptHelp: `shardpool ckpt --help` prints the subcommands and exits
// 0, as every --help does; `ckpt` alone and an unknown subcommand are
// usage errors (exit 2).
func TestCkptHelp(t *testing.T) {
	for _, c := range []struct {
		args []string
		want error
	}{{[]string{"ckpt", "--help"}, errHelp}, {[]string{"ckpt", "-h"}, errHelp}, {[]string{"ckpt", "help"}, errHelp},
		{[]string{"ckpt"}, errUsage}, {[]string{"ckpt", "comit"}, errUsage}} {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), c.args, &stdout, &stderr)
		if err != c.want || !strings.Contains(stderr.String(), "ckpt commit [--retain N] DIR SRC...") {
			t.Errorf("%v: %v, want %v and the subcommands\n%s", c.args, err, c.want, stderr.String())
		}
		if c.args[len(c.args)-1] == "comit" && !strings.Contains(stderr.String(), `unknown ckpt command "comit"`) {
			t.Errorf("%v: the error does not name the unknown command\n%s", c.args, stderr.String())
		}
	}
}

// TestTLSAuto: --tls auto serves TLS when any listener, the optional ones
// (HTTP, a cluster's routes) included, reaches beyond loopback.
func TestTLSAuto(t *testing.T) {
	for _, c := range []struct {
		listen, http, cluster string
		want                  bool
	}{
		{"127.0.0.1:4222", "127.0.0.1:8222", "", false},
		{"127.0.0.1:4222", "", "127.0.0.1:6222", false},
		{"0.0.0.0:4222", "", "", true},
		{"127.0.0.1:4222", "0.0.0.0:8222", "", true},
		{"127.0.0.1:4222", "", "0.0.0.0:6222", true},
	} {
		if got, err := tlsOn("auto", c.listen, c.http, c.cluster); err != nil || got != c.want {
			t.Errorf("tlsOn(auto, %q, %q, %q) = %v, %v; want %v", c.listen, c.http, c.cluster, got, err, c.want)
		}
	}
	if got, _ := tlsOn("off", "0.0.0.0:4222", "", "0.0.0.0:6222"); got {
		t.Error("--tls off served TLS")
	}
}

// TestSlotsFlag: the forms --slots takes, and the ones it refuses with
// what is wrong (a class given twice was taken silently, the last one
// winning).
func TestSlotsFlag(t *testing.T) {
	for _, tc := range []struct {
		in, want string // want: the String form, or the error's text
		ok       bool
	}{
		{"auto", "auto", true},
		{"4", "4", true},
		{"cpu=2", "cpu=2", true},
		{"0", "want at least 1", false},
		{"cpu=x", "want N or CLASS=N", false},
		{"=2", "want N or CLASS=N", false},
		{"cpu=2,cpu=3", "class cpu is given twice", false},
	} {
		var s slotsFlag
		err := s.Set(tc.in)
		if tc.ok && (err != nil || s.String() != tc.want) {
			t.Errorf("--slots %s: %q, %v; want %q", tc.in, s.String(), err, tc.want)
		}
		if !tc.ok && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("--slots %s: %v, want an error saying %q", tc.in, err, tc.want)
		}
	}
}

// TestPathsFlag: --path NAME=PATH, repeatable, each name once.
func TestPathsFlag(t *testing.T) {
	p := pathsFlag{}
	if err := p.Set("data=/srv/data"); err != nil || p["data"] != "/srv/data" {
		t.Fatalf("--path data=/srv/data: %v %v", p, err)
	}
	if err := p.Set("data=/other"); err == nil || !strings.Contains(err.Error(), "already /srv/data") {
		t.Fatalf("a name given twice: %v, want refused naming the first", err)
	}
	if err := p.Set("nopath"); err == nil {
		t.Fatal("--path nopath: accepted, want NAME=PATH")
	}
}

// TestHelpListsExitCodes: every command's --help ends with its exit codes
// (commandExits), each line a code and what it means, 0 first; a command
// added without an entry fails here (the names come from the newFlags
// calls in this package's sources).
func TestHelpListsExitCodes(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	call := regexp.MustCompile(`newFlags\("([a-z ]+)"`)
	names := map[string]bool{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range call.FindAllSubmatch(b, -1) {
			names[string(m[1])] = true
		}
	}
	if len(names) < 15 {
		t.Fatalf("found %d commands in newFlags calls, want every one: %v", len(names), names)
	}
	line := regexp.MustCompile(`^  (\d+) +\S`)
	for name := range names {
		if len(commandExits[name]) == 0 {
			t.Errorf("%s: no exit codes in commandExits", name)
			continue
		}
		var stdout, stderr bytes.Buffer
		if err := run(context.Background(), append(strings.Fields(name), "--help"), &stdout, &stderr); exitCode(err, &stderr) != 0 {
			t.Errorf("%s --help: %v", name, err)
			continue
		}
		_, exits, ok := strings.Cut(stderr.String(), "\nExit codes:\n")
		if !ok {
			t.Errorf("%s --help lists no exit codes:\n%s", name, stderr.String())
			continue
		}
		lines := strings.Split(strings.TrimSuffix(exits, "\n"), "\n")
		if len(lines) != len(commandExits[name]) {
			t.Errorf("%s --help: %d exit code lines, want %d:\n%s", name, len(lines), len(commandExits[name]), exits)
		}
		for i, l := range lines {
			m := line.FindStringSubmatch(l)
			switch {
			case m == nil:
				t.Errorf("%s --help: exit code line %q, want a code and what it means", name, l)
			case i == 0 && m[1] != "0":
				t.Errorf("%s --help: the first exit code is %s, want 0", name, m[1])
			}
		}
	}
}
