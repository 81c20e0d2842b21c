package testenv

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardpool/shardpool/stream"
)

// Job describes a run spec and manifest to write for a test.
type Job struct {
	Name    string
	Command []string
	// Shards is the number of shards, each with one input file of InputSize bytes.
	Shards    int
	InputSize int
	Retries   int
	Timeout   string
	// Extra is appended verbatim to the spec (class tables, env).
	Extra string
	// Line, when set, writes manifest line i (0-based) itself.
	Line func(i int, input string) string
}

// WriteJob writes inputs, manifest.jsonl and shardpool.toml into a new temp
// dir and returns the spec path.
func WriteJob(t testing.TB, j Job) string {
	t.Helper()
	dir := t.TempDir()
	if j.Name == "" {
		j.Name = "t"
	}
	if j.InputSize == 0 {
		j.InputSize = 64
	}
	var man strings.Builder
	for i := range j.Shards {
		in := filepath.Join("in", fmt.Sprintf("s%04d.txt", i))
		if err := os.MkdirAll(filepath.Join(dir, "in"), 0o755); err != nil {
			t.Fatal(err)
		}
		data := []byte(strings.Repeat(fmt.Sprintf("shard %d\n", i), j.InputSize/8+1)[:j.InputSize])
		if err := os.WriteFile(filepath.Join(dir, in), data, 0o644); err != nil {
			t.Fatal(err)
		}
		if j.Line != nil {
			man.WriteString(j.Line(i, in) + "\n")
			continue
		}
		b, _ := json.Marshal(map[string]any{"id": fmt.Sprintf("s%04d", i), "inputs": []string{in}})
		man.Write(append(b, '\n'))
	}
	if err := os.WriteFile(filepath.Join(dir, "manifest.jsonl"), []byte(man.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd, _ := json.Marshal(j.Command)
	spec := fmt.Sprintf("name = %q\nmanifest = \"manifest.jsonl\"\noutput = \"out\"\ncommand = %s\nretries = %d\ncode_rev = \"test\"\n",
		j.Name, cmd, j.Retries)
	if j.Timeout != "" {
		spec += fmt.Sprintf("timeout = %q\n", j.Timeout)
	}
	spec += j.Extra
	path := filepath.Join(dir, "shardpool.toml")
	if err := os.WriteFile(path, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// SetOutput rewrites a spec written by WriteJob to commit into out (an
// absolute path) and returns its text.
func SetOutput(t testing.TB, spec, out string) string {
	t.Helper()
	b, err := os.ReadFile(spec)
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Replace(string(b), "output = \"out\"\n", fmt.Sprintf("output = %q\n", out), 1)
	if text == string(b) {
		t.Fatalf("the spec names no output = \"out\" to replace:\n%s", b)
	}
	if err := os.WriteFile(spec, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return text
}

// RandomFile writes size random bytes to dir/name and returns its path.
func RandomFile(t testing.TB, dir, name string, size int) string {
	t.Helper()
	b := make([]byte, size)
	rand.Read(b)
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// LoadJob parses the spec at path and its manifest, failing t on an error.
func LoadJob(t testing.TB, path string) (*stream.Spec, *stream.Manifest) {
	t.Helper()
	spec, err := stream.LoadSpec(path)
	if err != nil {
		t.Fatalf("load spec: %v", err)
	}
	man, err := stream.LoadManifest(spec)
	if err != nil {
		t.Fatalf("load manifest: %v", err)
	}
	return spec, man
}

// Gate holds a test's commands until the test opens it: a file each
// command waits for, polling every 50 ms. A command that waits for what
// the test looks at, rather than sleeping through it, neither ends
// before the test has seen it on a slow machine nor makes the test wait
// out a sleep sized for one.
type Gate struct {
	t    testing.TB
	Path string // passed to a command as an argument, never in its script
}

// NewGate returns a closed gate in a temporary directory of t. Cleanup
// opens it, so that commands still waiting end with the test.
func NewGate(t testing.TB) *Gate {
	t.Helper()
	g := &Gate{t: t, Path: filepath.Join(t.TempDir(), "gate")}
	t.Cleanup(func() { _ = os.WriteFile(g.Path, nil, 0o644) })
	return g
}

// Open lets every command waiting for the gate go on, and those that
// come to it later through at once.
func (g *Gate) Open() {
	g.t.Helper()
	if err := os.WriteFile(g.Path, nil, 0o644); err != nil {
		g.t.Fatal(err)
	}
}

// Wait is a command that exits 0 once the gate is open, writing nothing.
func (g *Gate) Wait() []string {
	return []string{"sh", "-c", `while [ ! -e "$0" ]; do sleep 0.05; done`, g.Path}
}

// ThenCopy is a command that copies the shard's one input into its output
// once the gate is open.
func (g *Gate) ThenCopy() []string {
	return []string{"sh", "-c", `while [ ! -e "$1" ]; do sleep 0.05; done; cp "$2" "$3/"`, "sh", g.Path, "{input}", "{out}"}
}

// NoteThenCopy is ThenCopy that first notes that the shard's command
// started, for WaitStarted. A test that changes the output directory
// while commands wait must wait for them to start, not for their shards'
// RUNNING records: a worker writes the record before it looks at the
// output directory and starts the command.
func (g *Gate) NoteThenCopy() []string {
	return []string{"sh", "-c", `touch "$1.started.$4"; while [ ! -e "$1" ]; do sleep 0.05; done; cp "$2" "$3/"`, "sh", g.Path, "{input}", "{out}", "{id}"}
}

// WaitStarted waits until the commands (NoteThenCopy) of the shards ids
// have started.
func (g *Gate) WaitStarted(ids ...string) {
	g.t.Helper()
	Eventually(g.t, 30*time.Second, func() (bool, string) {
		for _, id := range ids {
			if _, err := os.Stat(g.Path + ".started." + id); err != nil {
				return false, "the command of shard " + id + " has not started"
			}
		}
		return true, ""
	})
}
