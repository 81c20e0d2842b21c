package stream

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseSize(t *testing.T) {
	cases := []struct {
		in   string
		want int64
		err  bool
	}{
		{"512MiB", 512 << 20, false},
		{"2GiB", 2 << 30, false},
		{"1.5G", 1_500_000_000, false},
		{"100KB", 100_000, false},
		{"0", 0, false},
		{"64", 64, false},
		{"1 TiB", 1 << 40, false},
		{"", 0, true},
		{"lots", 0, true},
		{"12 parsecs", 0, true},
		{"-1GiB", 0, true},
	}
	for _, c := range cases {
		got, err := ParseSize(c.in)
		if (err != nil) != c.err || got != c.want {
			t.Errorf("ParseSize(%q): got %d, %v; want %d, error %v", c.in, got, err, c.want, c.err)
		}
	}
}

// specWithCommand writes and loads a spec of run x, manifest m.jsonl and
// output o beside it, with command (TOML), and returns it and its
// directory.
func specWithCommand(t *testing.T, command string) (*Spec, string) {
	t.Helper()
	p := writeSpec(t, "name = \"x\"\nmanifest = \"m.jsonl\"\noutput = \"o\"\ncommand = "+command+"\n")
	spec, err := LoadSpec(p)
	if err != nil {
		t.Fatal(err)
	}
	return spec, filepath.Dir(p)
}

func writeSpec(t *testing.T, body string) string {
	t.Helper()
	dir := t.TempDir()
	p := filepath.Join(dir, "shardpool.toml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadSpecDefaultsAndResolution(t *testing.T) {
	p := writeSpec(t, `name = "demo-1"
manifest = "m.jsonl"
output = "../out"
command = ["gzip", "-k", "{input}"]
timeout = "90s"
code_rev = "abc"
[class.gpu]
cpus = 4
gpus = 1
memory = "16GiB"
vram = "40GiB"
time = "2h"
stage = true
`)
	s, err := LoadSpec(p)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Dir(p)
	if s.Manifest != filepath.Join(dir, "m.jsonl") || s.Output != filepath.Join(filepath.Dir(dir), "out") {
		t.Errorf("paths: got %s and %s, want them relative to the spec", s.Manifest, s.Output)
	}
	if s.Retries != DefaultRetries || s.Timeout.D() != 90*time.Second || s.CodeRev != "abc" {
		t.Errorf("scalars: got retries %d timeout %s code_rev %q", s.Retries, s.Timeout.D(), s.CodeRev)
	}
	g := s.Classes["gpu"]
	if g.CPUs != 4 || g.GPUs != 1 || g.Memory != 16<<30 || g.VRAM != 40<<30 || g.Time.D() != 2*time.Hour {
		t.Errorf("class gpu: got %+v", g)
	}
	if c, ok := s.Classes[DefaultClass]; !ok || c.CPUs != 1 {
		t.Errorf("default class: got %+v %v, want cpu with 1 cpu", c, ok)
	}
	if !s.StageFor("gpu") || s.StageFor("cpu") {
		t.Errorf("stage: gpu %v cpu %v, want true false", s.StageFor("gpu"), s.StageFor("cpu"))
	}
	if s.TimeoutFor("gpu") != 2*time.Hour || s.TimeoutFor("cpu") != 90*time.Second {
		t.Errorf("timeouts: gpu %s cpu %s", s.TimeoutFor("gpu"), s.TimeoutFor("cpu"))
	}
}

// TestRetryDelay: retry_delay is the wait after the first failed attempt,
// doubled for each later one, at most 60 times it; a spec without it
// leaves the delay to the worker (zero).
func TestRetryDelay(t *testing.T) {
	s, err := LoadSpec(writeSpec(t, "name = \"x\"\nmanifest = \"m\"\noutput = \"o\"\ncommand = [\"true\"]\nretry_delay = \"30s\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	for n, want := range map[int]time.Duration{1: 30 * time.Second, 2: time.Minute, 3: 2 * time.Minute, 6: 16 * time.Minute, 7: 30 * time.Minute, 50: 30 * time.Minute} {
		if got := s.RetryDelayAfter(n); got != want {
			t.Errorf("retry_delay 30s, after attempt %d: %s, want %s", n, got, want)
		}
	}
	if got := (&Spec{}).RetryDelayAfter(1); got != 0 {
		t.Errorf("no retry_delay: %s, want 0 (the worker's own)", got)
	}
}

func TestLoadSpecErrors(t *testing.T) {
	base := "name = \"x\"\nmanifest = \"m\"\noutput = \"o\"\ncommand = [\"true\"]\n"
	cases := []struct {
		name, body, want string
	}{
		{"missing command", "name = \"x\"\nmanifest = \"m\"\noutput = \"o\"\n", `field "command"`},
		{"shell string command", "name = \"x\"\nmanifest = \"m\"\noutput = \"o\"\ncommand = \"gzip {input}\"\n",
			`:4:11: field "command": invalid run spec: got a string, want an argv array such as ["gzip", "-k", "{input}"], never a shell string`},
		{"quoted retries", base + "retries = \"2\"\n", `:5:11: field "retries": invalid run spec: got a string, want a whole number`},
		{"class as a shard's class", base + "class = \"gpu\"\n", `field "class": invalid run spec: got a string, want a table of classes such as [class.gpu]`},
		{"class as a number", base + "class.gpu = 1\n", `field "class.gpu": invalid run spec: got an integer, want a table such as [class.gpu]`},
		{"fractional cpus", base + "[class.cpu]\ncpus = 0.5\n", `field "class.cpu.cpus": invalid run spec: got a float, want a whole number of CPUs, at least 1`},
		{"memory as a number", base + "[class.cpu]\nmemory = 1024\n", `field "class.cpu.memory": invalid run spec: got an integer, want a size such as "512MiB" or "2GiB"`},
		{"timeout as a number", base + "timeout = 60\n", `field "timeout": invalid run spec: got an integer, want a duration such as "90s" or "2h"`},
		{"profile setting quoted", base + "[profile]\nsustained = \"3\"\n", `field "profile.sustained": invalid run spec: got a string, want a whole number`},
		{"stage as a word", base + "stage = \"yes\"\n", `field "stage": invalid run spec: got a string, want true or false`},
		{"env as an array", base + "env = [\"A=1\"]\n", `field "env": invalid run spec: got an array, want a table of strings such as { MODE = "fast" }`},
		{"env number", base + "env = { A = 1 }\n", `field "env": invalid run spec: got an integer, want a string for each variable (quote numbers: { N = "4" })`},
		{"env value with a NUL", base + "[env]\nB = \"ok\"\nA = \"a\\u0000b\"\n", `:7: field "env.A": invalid run spec: the value holds a NUL character, which no environment variable can hold`},
		{"inputs in env", base + "env = { FILES = \"{inputs}\" }\n", `:5: field "env.FILES": invalid run spec: "{inputs}": {inputs} stands for one argument per input and has no place in one variable`},
		{"misspelt placeholder in env", base + "[env]\nHF_HOME = \"{scrach}/hf\"\n", `:6: field "env.HF_HOME": invalid run spec: "{scrach}/hf": {scrach} is not a placeholder; did you mean {scratch}?`},
		{"param template in env", base + "env = { N = \"{param.n}\" }\n", `:5: field "env.N": invalid run spec: "{param.n}": {param.n} is not a placeholder: params reach the command as environment variables, this one as SHARDPOOL_PARAM_N`},
		{"inputs inside an argument", base[:len(base)-len("command = [\"true\"]\n")] + "command = [\"cat\", \"x{inputs}\"]\n", "must stand alone"},
		{"bad timeout", base + "timeout = \"soon\"\n", `:5: field "timeout"`},
		{"retry delay as a number", base + "retry_delay = 30\n", `:5:15: field "retry_delay": invalid run spec: got an integer, want a duration such as "90s" or "2h"`},
		{"negative retry delay", base + "retry_delay = \"-1s\"\n", `:5: field "retry_delay": invalid run spec: "-1s" is not a Go duration from 1ns to 24h0m0s such as "30s" or "5m"`},
		{"retry delay past a day", base + "retry_delay = \"25h\"\n", `:5: field "retry_delay"`},
		{"negative retries", base + "retries = -1\n", `:5: field "retries"`},
		{"zero cpus", base + "[class.cpu]\ncpus = 0\n", `:6: field "class.cpu.cpus"`},
		{"bad class name", base + "[class.GPU]\ncpus = 1\n", `:5: field "class.GPU"`},
		{"output root", "name = \"x\"\nmanifest = \"m\"\noutput = \"/\"\ncommand = [\"true\"]\n", `:3: field "output"`},
		{"unknown top-level", base + "retires = 3\n", `:5: field "retires"`},
		{"misspelt key", base + "retires = 3\n", `did you mean "retries"?`},
		{"plural table", base + "[classes.gpu]\ncpus = 1\n", `"classes", did you mean "class"?`},
		{"swapped letters", base + "[class.cpu]\nmemroy = \"1G\"\n", `did you mean "memory"? (known here: cpus, gpus, memory, scratch, stage, time, vram)`},
		{"nested table", base + "[profile]\nsustain = 3\n", `did you mean "sustained"?`},
		{"top-level key under a class", base + "[class.cpu]\ncpus = 1\nretries = 3\n", `:7: field "class.cpu.retries": invalid run spec: unknown field: "retries" is a top-level key: in TOML every key after a [table] header belongs to that table, so put it above the first one (known here: cpus,`},
		{"nothing close", base + "colour = 3\n", `unknown field: "colour" (known here: class, code_rev, command,`},
		{"misspelt placeholder", strings.Replace(base, `["true"]`, `["sh", "-c", "gzip -c {inptus} > {out}/x"]`, 1), `:4: field "command": invalid run spec: argument 2 ("gzip -c {inptus} > {out}/x"): {inptus} is not a placeholder; did you mean {inputs}?`},
		{"placeholder cut short", strings.Replace(base, `["true"]`, `["cp", "{in}", "{out}/"]`, 1), `:4: field "command": invalid run spec: argument 1 ("{in}"): {in} is not a placeholder; did you mean {input}?`},
		{"outputs as a string", base + "outputs = \"x.gz\"\n", `:5:11: field "outputs": invalid run spec: got a string, want an array of paths inside {out} such as ["{id}.gz", "*.csv"]`},
		{"output outside {out}", base + "outputs = [\"x.gz\", \"../y\"]\n", `:5: field "outputs": invalid run spec: entry 1 ("../y"): not a path inside {out}`},
		{"absolute output", base + "outputs = [\"/tmp/x\"]\n", `:5: field "outputs": invalid run spec: entry 0 ("/tmp/x"): not a path inside {out}`},
		{"output with {out}", base + "outputs = [\"{out}/x\"]\n", `entry 0 ("{out}/x"): {out} is not allowed here: outputs are paths inside {out}, and {id} is the only placeholder they take`},
		{"output with a misspelt {id}", base + "outputs = [\"{ide}.gz\"]\n", `{ide} is not allowed here`},
		{"output pattern", base + "outputs = [\"x[.gz\"]\n", `entry 0 ("x[.gz"): not a valid pattern (syntax error in pattern)`},
		{"empty output", base + "outputs = [\"\"]\n", `entry 0 (""): empty`},
		{"misspelt placeholder of the validator", base + "validator = [\"test\", \"-s\", \"{ouput}/x\"]\n", `:5: field "validator"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := LoadSpec(writeSpec(t, c.body))
			if !errors.Is(err, ErrInvalidSpec) {
				t.Fatalf("got %v, want ErrInvalidSpec", err)
			}
			if !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "shardpool.toml") {
				t.Fatalf("got %q, want the file and %q", err, c.want)
			}
		})
	}
}

func TestExpand(t *testing.T) {
	v := Vars{ID: "a1", Inputs: []string{"/x", "/y"}, Out: "/o", Ckpt: "/c", Scratch: "/s", Attempt: 2}
	got, err := Expand([]string{"run", "--id={id}", "{inputs}", "{out}/f", "{ckpt}", "{scratch}", "{attempt}", "{print $1}", "{unknown}"}, v)
	if err != nil {
		t.Fatal(err)
	}
	want := "run|--id=a1|/x|/y|/o/f|/c|/s|2|{print $1}|{unknown}"
	if strings.Join(got, "|") != want {
		t.Fatalf("got %q, want %q", strings.Join(got, "|"), want)
	}
	if _, err := Expand([]string{"{input}"}, v); !errors.Is(err, ErrPlaceholder) {
		t.Fatalf("{input} with two inputs: got %v, want ErrPlaceholder", err)
	}
}

func TestFingerprintCoversWhatChangesResults(t *testing.T) {
	p := writeSpec(t, "name = \"x\"\nmanifest = \"m\"\noutput = \"o\"\ncommand = [\"true\"]\ncode_rev = \"r1\"\n")
	s, err := LoadSpec(p)
	if err != nil {
		t.Fatal(err)
	}
	base := Fingerprint(s, "m1")
	if Fingerprint(s, "m1") != base {
		t.Fatal("fingerprint is not deterministic")
	}
	mut := []func(s *Spec){
		func(s *Spec) { s.Command = []string{"false"} },
		func(s *Spec) { s.Env = map[string]string{"A": "1"} },
		func(s *Spec) { s.CodeRev = "r2" },
		func(s *Spec) { c := s.Classes["cpu"]; c.CPUs = 2; s.Classes = map[string]Class{"cpu": c} },
	}
	for i, m := range mut {
		c := *s
		m(&c)
		if Fingerprint(&c, "m1") == base {
			t.Errorf("mutation %d did not change the fingerprint", i)
		}
	}
	if Fingerprint(s, "m2") == base {
		t.Error("a changed manifest did not change the fingerprint")
	}
	c := *s
	c.Retries, c.Output = 9, "/elsewhere"
	if Fingerprint(&c, "m1") != base {
		t.Error("retries or output location changed the fingerprint; they do not change results")
	}
}

func TestDecodeRefusesUnknownVersion(t *testing.T) {
	var r ShardRecord
	if err := Decode([]byte(`{"v":99,"id":"x"}`), &r); !errors.Is(err, ErrSchemaVersion) {
		t.Fatalf("got %v, want ErrSchemaVersion", err)
	}
	b, _ := Encode(&ShardRecord{ID: "x"})
	if err := Decode(b, &r); err != nil || r.ID != "x" || r.V != SchemaVersion {
		t.Fatalf("round trip: got %+v, %v", r, err)
	}
}

// TestEditedScriptIsANewFingerprint: the job's own script (named by a
// relative path) and an uncommitted edit in a git checkout both change the
// fingerprint, so that outputs of the old code are not taken for the new.
func TestEditedScriptIsANewFingerprint(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "job.sh")
	write := func(p, s string) {
		t.Helper()
		if err := os.WriteFile(p, []byte(s), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write(script, "#!/bin/sh\necho one\n")
	spec := filepath.Join(dir, "shardpool.toml")
	write(spec, "name = \"x\"\nmanifest = \"m\"\noutput = \"o\"\ncommand = [\"sh\", \"job.sh\", \"{id}\", \"-v\", \"/bin/true\"]\n")
	fp := func() (string, *Spec) {
		t.Helper()
		s, err := LoadSpec(spec)
		if err != nil {
			t.Fatal(err)
		}
		return Fingerprint(s, "m1"), s
	}
	first, s := fp()
	if len(s.Files) != 1 || s.Files["job.sh"] == "" {
		t.Fatalf("files hashed: got %v, want job.sh only", s.Files)
	}
	if again, _ := fp(); again != first {
		t.Fatal("the same script gave another fingerprint")
	}
	write(script, "#!/bin/sh\necho two\n")
	edited, _ := fp()
	if edited == first {
		t.Fatal("an edited script kept the fingerprint")
	}

	// In a git checkout, code_rev is HEAD, plus the diff while tracked
	// files differ from it.
	git := func(args ...string) {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-C", dir, "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	git("init", "-q")
	write(filepath.Join(dir, "lib.py"), "x = 1\n")
	git("add", "lib.py")
	git("commit", "-q", "-m", "one")
	_, clean := fp()
	if len(clean.CodeRev) != 40 {
		t.Fatalf("code_rev of a clean checkout: got %q, want HEAD", clean.CodeRev)
	}
	write(filepath.Join(dir, "lib.py"), "x = 2\n")
	_, dirty := fp()
	if !strings.HasPrefix(dirty.CodeRev, clean.CodeRev+"+dirty.") {
		t.Fatalf("code_rev with an uncommitted edit: got %q, want HEAD+dirty.<diff checksum>", dirty.CodeRev)
	}
	write(filepath.Join(dir, "lib.py"), "x = 3\n")
	if _, other := fp(); other.CodeRev == dirty.CodeRev {
		t.Fatal("another uncommitted edit kept code_rev")
	}
}

// Seconds is written exactly as encoding/json writes the float64 it stands
// for, and read back from it.
func TestSecondsJSON(t *testing.T) {
	for _, d := range []time.Duration{0, time.Nanosecond, 1234567 * time.Nanosecond, 90 * time.Second, -3 * time.Millisecond, 1<<62 - 1} {
		got, err := json.Marshal(Seconds(d))
		want, _ := json.Marshal(d.Seconds())
		if err != nil || string(got) != string(want) {
			t.Fatalf("%v: got %s (%v), want %s", d, got, err, want)
		}
		var back Seconds
		if err := json.Unmarshal(got, &back); err != nil || math.Abs(float64(back.D()-d)) > float64(time.Microsecond) {
			t.Fatalf("%v: read back %v (%v)", d, back.D(), err)
		}
	}
	var s struct{ D Seconds }
	if err := json.Unmarshal([]byte(`{"D":"soon"}`), &s); err == nil {
		t.Fatal(`"soon" read as seconds`)
	}
}

// Braces that are not near a placeholder pass through untouched: an awk
// program, a shell brace expansion, a short or unrelated word.
func TestBracesThatAreNoPlaceholderTypo(t *testing.T) {
	for _, a := range []string{"{print $1}", "{a,b}", "{in}", "{output}", "{config_file}", "${HOME}", "{}"} {
		if err := checkArgv([]string{"sh", "-c", "echo " + a}); err != nil {
			t.Errorf("%s: %v, want it passed as it is", a, err)
		}
	}
	// Alone as an argument, a short word passes unless it begins a
	// placeholder: {in} there can only be {input} cut short.
	for _, a := range []string{"{ab}", "{o}", "{x_}"} {
		if err := checkArgv([]string{"tool", a}); err != nil {
			t.Errorf("argument %s: %v, want it passed as it is", a, err)
		}
	}
	for a, want := range map[string]string{"{in}": "{input}", "{ou}": "{out}", "{ck}": "{ckpt}", "{sc}": "{scratch}"} {
		if err := checkArgv([]string{"tool", a}); err == nil || !strings.Contains(err.Error(), "did you mean "+want+"?") {
			t.Errorf("argument %s: %v, want it refused, suggesting %s", a, err, want)
		}
	}
	if got := likelyMeant("ouput", placeholders); got != "out" {
		t.Errorf(`likelyMeant("ouput") = %q, want "out" (the longer shared beginning of two as close)`, got)
	}
}

// TestParamNamedLikeATemplateIsRefused: {param.n} in a command reached
// every shard as that text; `sh -c 'seq 1 $0 > $1/seq.txt' {param.n}
// {out}` wrote an empty file, exited 0, and every shard validated. Params
// reach the command as environment variables, and the refusal names the
// variable. Other dotted words in braces pass as they are.
func TestParamNamedLikeATemplateIsRefused(t *testing.T) {
	for a, want := range map[string]string{
		"{param.n}":                   "SHARDPOOL_PARAM_N",
		"--lr={params.learning-rate}": "SHARDPOOL_PARAM_LEARNING_RATE",
		"{param:seed}":                "SHARDPOOL_PARAM_SEED",
		"{params['batch size']}":      "SHARDPOOL_PARAM_BATCH_SIZE",
		"{params[\"k\"]}":             "SHARDPOOL_PARAM_K",
		"{{ params.model }}":          "SHARDPOOL_PARAM_MODEL",
		"{params}":                    "SHARDPOOL_PARAM_ and the key upper-cased",
		"{param}":                     "SHARDPOOL_PARAM_ and the key upper-cased",
	} {
		err := checkArgv([]string{"tool", a})
		switch {
		case want == "" && err != nil:
			t.Errorf("%s: %v, want it passed as it is", a, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), "is not a placeholder: params reach the command as environment variables") || !strings.Contains(err.Error(), want)):
			t.Errorf("%s: got %v, want it refused naming %s", a, err, want)
		}
	}
	for _, a := range []string{"{print $1}", "{a.b}", "{x:y}", "{parameters}", "{config.param}"} {
		if err := checkArgv([]string{"sh", "-c", "echo " + a}); err != nil {
			t.Errorf("%s: %v, want it passed as it is", a, err)
		}
	}
	base := "name = \"a\"\nmanifest = \"m.jsonl\"\noutput = \"out\"\ncommand = [\"sh\", \"-c\", \"seq 1 $0 > $1/seq.txt\", \"{param.n}\", \"{out}\"]\n"
	dir := t.TempDir()
	path := filepath.Join(dir, "spec.toml")
	if err := os.WriteFile(path, []byte(base), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := LoadSpec(path)
	want := path + `:4: field "command": invalid run spec: argument 3 ("{param.n}"): {param.n} is not a placeholder: params reach the command as environment variables, this one as SHARDPOOL_PARAM_N (in a shell: "$SHARDPOOL_PARAM_N")`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("LoadSpec: got %v, want %s", err, want)
	}
}

func TestNoSuggestionForUnrelatedKeys(t *testing.T) {
	for typo, want := range map[string]string{"retry": "retries", "classes": "class", "cpu": "cpus", "foo": "", "gpu_count": "", "env": "env", "tim": "time"} {
		if got := likelyMeant(typo, []string{"class", "cpus", "env", "retries", "time", "timeout"}); got != want {
			t.Errorf("likelyMeant(%q) = %q, want %q", typo, got, want)
		}
	}
}

// A manifest with many bad lines reports them in one pass: a user with a
// 10,000-line manifest should not fix one line per try.
// TestSpecReportsEveryProblem: a spec with several mistakes names each of
// them, in line order under a line that counts them, so that one try
// shows all there is to fix (as a manifest's invalid lines are); the
// unknown keys among them too, whose neighbours are still checked.
func TestSpecReportsEveryProblem(t *testing.T) {
	body := "name = \"x\"\n" + //                      1
		"manifest = \"m\"\n" + //                     2
		"output = \"o\"\n" + //                       3
		"command = [\"cp\", \"{in}\", \"{out}\"]\n" + // 4: not a placeholder
		"timeout = \"10 minutes\"\n" + //             5: not a duration
		"retrys = 2\n" + //                           6: unknown
		"[class.gpu]\n" + //                          7
		"memroy = \"1G\"\n" + //                      8: unknown
		"cpus = 0\n" //                               9: too few
	path := writeSpec(t, body)
	_, err := LoadSpec(path)
	if !errors.Is(err, ErrInvalidSpec) {
		t.Fatalf("got %v, want ErrInvalidSpec", err)
	}
	lines := strings.Split(err.Error(), "\n")
	want := []string{
		path + ": invalid run spec: 5 problems, each below",
		path + `:4: field "command": invalid run spec: argument 1 ("{in}"): {in} is not a placeholder; did you mean {input}?`,
		path + `:5: field "timeout": invalid run spec: "10 minutes" is not a positive Go duration`,
		path + `:6: field "retrys": invalid run spec: unknown field: "retrys", did you mean "retries"?`,
		path + `:8: field "class.gpu.memroy": invalid run spec: unknown field: "memroy", did you mean "memory"?`,
		path + `:9: field "class.gpu.cpus": invalid run spec: 0: want at least 1`,
	}
	if len(lines) != len(want) {
		t.Fatalf("got %d lines, want %d:\n%s", len(lines), len(want), err)
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("line %d: got %q, want it to begin %q", i+1, lines[i], w)
		}
	}

	// One mistake alone is its own line, with no count above it.
	_, err = LoadSpec(writeSpec(t, "name = \"x\"\nmanifest = \"m\"\noutput = \"o\"\ncommand = [\"true\"]\nretries = -1\n"))
	if err == nil || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), `:5: field "retries"`) {
		t.Fatalf("got %v, want the retries on line 5 alone", err)
	}
}

func TestManifestReportsEveryInvalidLine(t *testing.T) {
	dir := t.TempDir()
	specPath := filepath.Join(dir, "shardpool.toml")
	os.WriteFile(specPath, []byte("name = \"x\"\nmanifest = \"m.jsonl\"\noutput = \"o\"\ncommand = [\"cat\", \"{inputs}\"]\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "ok"), []byte("x"), 0o644)
	spec, err := LoadSpec(specPath)
	if err != nil {
		t.Fatal(err)
	}
	write := func(lines []string) {
		os.WriteFile(filepath.Join(dir, "m.jsonl"), []byte(strings.Join(lines, "\n")+"\n"), 0o644)
	}

	var lines []string
	for i := range 30 {
		if i%5 == 0 {
			lines = append(lines, fmt.Sprintf(`{"id":"good%d","inputs":["ok"]}`, i))
		} else {
			lines = append(lines, fmt.Sprintf(`{"id":"bad%d","inputs":["missing%d"]}`, i, i))
		}
	}
	lines = append(lines, `{"id":"good0","inputs":["ok"]}`) // line 31: a duplicate
	write(lines)
	_, err = LoadManifest(spec)
	if !errors.Is(err, ErrInvalidManifest) {
		t.Fatalf("got %v, want ErrInvalidManifest", err)
	}
	msg := err.Error()
	if !strings.Contains(msg, "25 invalid lines, the first 20 below") {
		t.Fatalf("no count of the invalid lines:\n%s", msg)
	}
	if !strings.Contains(msg, "m.jsonl:2: field \"inputs\"") || !strings.Contains(msg, "missing24") {
		t.Fatalf("the first 20 invalid lines are not all reported:\n%s", msg)
	}
	if strings.Contains(msg, "missing26") || strings.Contains(msg, ":31:") {
		t.Fatalf("more than 20 invalid lines reported:\n%s", msg)
	}
	if n := strings.Count(msg, "\n"); n != 20 {
		t.Fatalf("got %d lines after the first, want 20 (one per invalid line):\n%s", n, msg)
	}

	// No manifest at all: named at the spec's line that gives its path.
	os.Remove(filepath.Join(dir, "m.jsonl"))
	_, err = LoadManifest(spec)
	if !errors.Is(err, ErrInvalidManifest) || !strings.HasPrefix(err.Error(), specPath+`:2: field "manifest": `) || !strings.Contains(err.Error(), "no such file") {
		t.Fatalf("missing manifest: got %v, want ErrInvalidManifest at %s:2, field \"manifest\"", err, specPath)
	}

	// A directory where the manifest goes: named at the spec's line too.
	os.Mkdir(filepath.Join(dir, "m.jsonl"), 0o755)
	_, err = LoadManifest(spec)
	if !errors.Is(err, ErrInvalidManifest) || !strings.HasPrefix(err.Error(), specPath+`:2: field "manifest": `) || !strings.Contains(err.Error(), "is a directory") {
		t.Fatalf("a directory as the manifest: got %v, want ErrInvalidManifest at %s:2, field \"manifest\"", err, specPath)
	}
	os.Remove(filepath.Join(dir, "m.jsonl"))

	// One bad line: just its error, no summary.
	write([]string{`{"id":"a","inputs":["ok"]}`, `{"id":"a","inputs":["ok"]}`})
	_, err = LoadManifest(spec)
	if err == nil || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), `m.jsonl:2: field "id"`) || !strings.Contains(err.Error(), "first on line 1") {
		t.Fatalf("got %v, want the duplicate on line 2 alone", err)
	}
}

// TestByteOrderMarkAndCRLF: a spec and a manifest saved by an editor that
// writes a UTF-8 byte order mark and CRLF line ends load as without them;
// the manifest's fingerprint still follows its bytes.
func TestByteOrderMarkAndCRLF(t *testing.T) {
	dir := t.TempDir()
	bom := "\xef\xbb\xbf"
	specPath := filepath.Join(dir, "shardpool.toml")
	os.WriteFile(specPath, []byte(bom+"name = \"x\"\r\nmanifest = \"m.jsonl\"\r\noutput = \"o\"\r\ncommand = [\"true\", \"{id}\"]\r\n"), 0o644)
	spec, err := LoadSpec(specPath)
	if err != nil {
		t.Fatalf("spec with a byte order mark: %v", err)
	}
	if spec.Name != "x" || len(spec.Command) != 2 {
		t.Fatalf("spec: name %q command %q", spec.Name, spec.Command)
	}
	load := func(content string) *Manifest {
		t.Helper()
		os.WriteFile(filepath.Join(dir, "m.jsonl"), []byte(content), 0o644)
		m, err := LoadManifest(spec)
		if err != nil {
			t.Fatalf("manifest %q: %v", content, err)
		}
		if len(m.Shards) != 2 || m.Shards[0].ID != "a" || m.Shards[1].ID != "b" {
			t.Fatalf("manifest %q: shards %+v, want a and b", content, m.Shards)
		}
		return m
	}
	plain := load("{\"id\":\"a\"}\n{\"id\":\"b\"}\n")
	marked := load(bom + "{\"id\":\"a\"}\r\n{\"id\":\"b\"}\r\n\r\n")
	if plain.Hash == marked.Hash {
		t.Fatalf("two manifests of different bytes have one hash %s", plain.Hash)
	}
	// A mark anywhere but at the start is an error on its line.
	os.WriteFile(filepath.Join(dir, "m.jsonl"), []byte("{\"id\":\"a\"}\n"+bom+"{\"id\":\"b\"}\n"), 0o644)
	if _, err := LoadManifest(spec); err == nil || !strings.Contains(err.Error(), "m.jsonl:2:") {
		t.Fatalf("a byte order mark on line 2: got %v, want an error on line 2", err)
	}
}

// A shard whose input paths and params would not fit in one message (or
// on one command line) is refused at load with its file, line and field,
// before anything is published: before, the publish failed half way with
// "maximum payload exceeded".
func TestShardTooBigForAMessage(t *testing.T) {
	spec, dir := specWithCommand(t, `["cat", "{inputs}"]`)
	name := strings.Repeat("n", 60)
	os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o644)
	line := func(id string, n int) string {
		b, _ := json.Marshal(map[string]any{"id": id, "inputs": slices.Repeat([]string{name}, n)})
		return string(b)
	}
	// Each input resolves to an absolute path of len(dir)+61 bytes.
	fits := MaxShardBytes/(len(dir)+61+3) - 1
	os.WriteFile(filepath.Join(dir, "m.jsonl"), []byte(line("fits", fits)+"\n"+line("huge", 4*fits)+"\n"), 0o644)
	_, err := LoadManifest(spec)
	if !errors.Is(err, ErrInvalidManifest) || !strings.Contains(err.Error(), `m.jsonl:2: field "inputs"`) ||
		!strings.Contains(err.Error(), "a shard's message holds at most 1.0MiB") || strings.Contains(err.Error(), ":1:") {
		t.Fatalf("got %v, want line 2 alone refused for its size", err)
	}
}

// TestOutputsMustBePresent: a spec's outputs load as written, and
// MissingOutputs names each pattern that matches nothing in {out}, with
// {id} expanded.
func TestOutputsMustBePresent(t *testing.T) {
	s, err := LoadSpec(writeSpec(t, "name = \"x\"\nmanifest = \"m\"\noutput = \"o\"\ncommand = [\"true\"]\noutputs = [\"{id}.gz\", \"logs/*.txt\", \"{a}\"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(s.Outputs, "|") != "{id}.gz|logs/*.txt|{a}" {
		t.Fatalf("outputs %q", s.Outputs)
	}
	out := t.TempDir()
	if got := MissingOutputs(out, s.Outputs, "s1"); strings.Join(got, "|") != "s1.gz|logs/*.txt|{a}" {
		t.Fatalf("empty {out}: missing %q, want every pattern with {id} expanded", got)
	}
	for _, f := range []string{"s1.gz", "logs/a.txt", "{a}", "s2.gz"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(out, f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(out, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got := MissingOutputs(out, s.Outputs, "s1"); len(got) != 0 {
		t.Fatalf("all present: missing %q", got)
	}
	if got := MissingOutputs(out, s.Outputs, "s3"); strings.Join(got, "|") != "s3.gz" {
		t.Fatalf("another shard's file only: missing %q, want s3.gz", got)
	}
}

// TestParamsBecomeShellVariables: a manifest param's key becomes a
// variable a shell can read ("batch-size" is SHARDPOOL_PARAM_BATCH_SIZE);
// two keys of one shard that would become the same variable are refused
// with the line and field, and a key that cannot be a variable at all too.
func TestParamsBecomeShellVariables(t *testing.T) {
	for key, want := range map[string]string{"lr": "SHARDPOOL_PARAM_LR", "batch-size": "SHARDPOOL_PARAM_BATCH_SIZE",
		"a.b c": "SHARDPOOL_PARAM_A_B_C", "Größe": "SHARDPOOL_PARAM_GR__E", "9x": "SHARDPOOL_PARAM_9X"} {
		if got := ParamEnv(key); got != want {
			t.Errorf("ParamEnv(%q): got %q, want %q", key, got, want)
		}
	}
	spec, dir := specWithCommand(t, `["true"]`)
	for _, tc := range []struct{ line, want string }{
		{`{"id":"a","params":{"batch-size":"1","batch_size":"2"}}`, `m.jsonl:2: field "params": invalid manifest: keys "batch-size" and "batch_size" both become the variable SHARDPOOL_PARAM_BATCH_SIZE`},
		{`{"id":"a","params":{"lr":"1","LR":"2"}}`, `m.jsonl:2: field "params": invalid manifest: keys "LR" and "lr" both become the variable SHARDPOOL_PARAM_LR`},
		{`{"id":"a","params":{"x=y":"1"}}`, `m.jsonl:2: field "params": invalid manifest: key "x=y" cannot become an environment variable`},
	} {
		os.WriteFile(filepath.Join(dir, "m.jsonl"), []byte("{\"id\":\"ok\",\"params\":{\"batch-size\":\"1\",\"lr\":\"2\"}}\n"+tc.line+"\n"), 0o644)
		_, err := LoadManifest(spec)
		if !errors.Is(err, ErrInvalidManifest) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error containing %q", tc.line, err, tc.want)
		}
	}
}

// TestParamsTakeNumbersAndBooleans: a sweep's manifest written by a
// JSON library has numbers and booleans for values ({"lr": 0.001}), and
// every such line was refused ("want an object of string values"). They
// reach the command as their JSON text, as written; null is an empty
// string; an object, an array or a NUL character, which no variable can
// hold, is refused naming the key.
func TestParamsTakeNumbersAndBooleans(t *testing.T) {
	spec, dir := specWithCommand(t, `["true"]`)
	os.WriteFile(filepath.Join(dir, "m.jsonl"), []byte(`{"id":"a","params":{"lr":0.001,"small":1e-3,"n":5,"big":12345678901234567890,"neg":-2,"flag":true,"off":false,"none":null,"s":"x y"}}`+"\n"), 0o644)
	m, err := LoadManifest(spec)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"lr": "0.001", "small": "1e-3", "n": "5", "big": "12345678901234567890", "neg": "-2", "flag": "true", "off": "false", "none": "", "s": "x y"}
	if got := m.Shards[0].Params; !maps.Equal(got, want) {
		t.Errorf("params: got %v, want %v", got, want)
	}
	for _, tc := range []struct{ line, want string }{
		{`{"id":"a","params":{"cfg":{"a":1}}}`, `m.jsonl:1: field "params": invalid manifest: key "cfg" holds an object: params reach the command as environment variables`},
		{`{"id":"a","params":{"ids":[1,2]}}`, `m.jsonl:1: field "params": invalid manifest: key "ids" holds an array`},
		{`{"id":"a","params":{"z":"a\u0000b"}}`, `m.jsonl:1: field "params": invalid manifest: key "z": the value holds a NUL character`},
		{`{"id":"a","params":["lr",1]}`, `m.jsonl:1: field "params": invalid manifest: want an object of strings, numbers or booleans`},
	} {
		os.WriteFile(filepath.Join(dir, "m.jsonl"), []byte(tc.line+"\n"), 0o644)
		_, err := LoadManifest(spec)
		if !errors.Is(err, ErrInvalidManifest) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error containing %q", tc.line, err, tc.want)
		}
	}
}

// TestParamNamedAsAPlaceholderIsRefused: a command that names a param in
// braces ({n} for param n) got the braces as they are, since params are
// environment variables, not placeholders; a shell loop bounded by it ran
// no step, exited 0, and every shard validated with nothing done. The
// manifest is refused at the first shard with such a param, naming the
// variable to use; braces that match no param pass, as before.
func TestParamNamedAsAPlaceholderIsRefused(t *testing.T) {
	dir := t.TempDir()
	specPath := filepath.Join(dir, "shardpool.toml")
	for _, tc := range []struct{ command, validator, want string }{
		{`["./job.sh", "{n}", "{out}"]`, "", `m.jsonl:2: field "params": invalid manifest: key "n" appears as {n} in argument 1 of the command in ` + specPath +
			`, but params are not placeholders: that text would reach the command as it is; a param reaches the command as the environment variable SHARDPOOL_PARAM_N (in a shell: "$SHARDPOOL_PARAM_N")`},
		{`["sh", "-c", "seq {batch-size} > {out}/x"]`, "", `key "batch-size" appears as {batch-size} in argument 2 of the command`},
		{`["true"]`, `["check", "{n}"]`, `key "n" appears as {n} in argument 1 of the validator`},
		{`["true"]`, `env`, `key "n" appears as {n} in env STEPS in ` + specPath + `, but params are not placeholders`},
		{`["awk", "{print $1}", "{input}"]`, "", ""},
	} {
		spec := "name = \"x\"\nmanifest = \"m.jsonl\"\noutput = \"o\"\ncommand = " + tc.command + "\n"
		switch tc.validator {
		case "":
		case "env":
			spec += "env = { STEPS = \"{n}\" }\n"
		default:
			spec += "validator = " + tc.validator + "\n"
		}
		os.WriteFile(specPath, []byte(spec), 0o644)
		os.WriteFile(filepath.Join(dir, "in"), []byte("x"), 0o644)
		os.WriteFile(filepath.Join(dir, "m.jsonl"), []byte("{\"id\":\"a\",\"inputs\":[\"in\"]}\n{\"id\":\"b\",\"inputs\":[\"in\"],\"params\":{\"n\":\"3\",\"batch-size\":\"2\"}}\n"), 0o644)
		sp, err := LoadSpec(specPath)
		if err != nil {
			t.Fatalf("%s: %v", tc.command, err)
		}
		_, err = LoadManifest(sp)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v, want no error", tc.command, err)
		case tc.want != "" && (!errors.Is(err, ErrInvalidManifest) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: got %v, want an error containing %q", tc.command, err, tc.want)
		}
	}
}

// TestRepeatedKeysAreRefused: encoding/json keeps the last of a repeated
// key without a word, so {"inputs":[a],"inputs":[b]} ran on b alone. A
// line that gives a field twice, or a param twice, is refused with its
// line and field; keys that only look alike (escaped, nested, inside
// strings) are not taken for repeats.
func TestRepeatedKeysAreRefused(t *testing.T) {
	spec, dir := specWithCommand(t, `["true"]`)
	os.WriteFile(filepath.Join(dir, "a"), []byte("a"), 0o644)
	os.WriteFile(filepath.Join(dir, "b"), []byte("b"), 0o644)
	for _, tc := range []struct{ line, want string }{
		{`{"id":"s","inputs":["a"],"inputs":["b"]}`, `m.jsonl:2: field "inputs": invalid manifest: given twice on this line`},
		{`{"id":"s","params":{"lr":"1","lr":"2"}}`, `m.jsonl:2: field "params": invalid manifest: key "lr" given twice`},
		{`{"id":"s","i\u0064":"t"}`, `m.jsonl:2: field "id": invalid manifest: given twice on this line`},
		{`{"id":"s","params":{"":"1","":"2"}}`, `m.jsonl:2: field "params"`},
		{`{"id":"s","params":{"a":"{\"id\":1,\"id\":2}","b":"x\\"}, "inputs":["a"]}`, ""},
		{`{"id":"s","params":{"id":"1","class":"2"},"class":"cpu"}`, ""},
	} {
		os.WriteFile(filepath.Join(dir, "m.jsonl"), []byte("{\"id\":\"ok\"}\n"+tc.line+"\n"), 0o644)
		_, err := LoadManifest(spec)
		if tc.want == "" {
			if err != nil {
				t.Errorf("%s: got %v, want it loaded", tc.line, err)
			}
			continue
		}
		if !errors.Is(err, ErrInvalidManifest) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error containing %q", tc.line, err, tc.want)
		}
	}
}

// FuzzCountKeys holds countKeys to a decoder's count of an object's own
// keys, on any object the decoder accepts.
func FuzzCountKeys(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":1,"b":[{"c":2}],"d":"}\"{,"}`, `{"a":{"a":{"a":1}},"a":[1,2]}`, `{"\\":"\\\"","x":null}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		dec := json.NewDecoder(strings.NewReader(s))
		if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
			return
		}
		want := 0
		for dec.More() {
			if _, err := dec.Token(); err != nil {
				return
			}
			var v json.RawMessage
			if err := dec.Decode(&v); err != nil {
				return
			}
			want++
		}
		if tok, err := dec.Token(); err != nil || tok != json.Delim('}') {
			return
		}
		if _, err := dec.Token(); err != io.EOF {
			return // more after the object
		}
		if got := countKeys([]byte(s), nil); got != want {
			t.Fatalf("countKeys(%q) = %d, want %d", s, got, want)
		}
	})
}

// TestUnexpandedInputPathsAreExplained: a manifest is no shell, so an
// input written "~/data/x" or "$DATA/x" is looked up as it is, relative
// to the spec's directory. The error says so instead of naming a path
// the user never meant.
func TestUnexpandedInputPathsAreExplained(t *testing.T) {
	spec, dir := specWithCommand(t, `["cat", "{inputs}"]`)
	for _, tc := range []struct{ input, want string }{
		{"~/x.txt", "a leading ~ is not expanded"},
		{"~alice/x.txt", "a leading ~ is not expanded"},
		{"$HOME/x.txt", "environment variables are not expanded"},
		{"${DATA}/x.txt", "environment variables are not expanded"},
		{"missing.txt", ""},
	} {
		os.WriteFile(filepath.Join(dir, "m.jsonl"), []byte(`{"id":"s","inputs":["`+tc.input+`"]}`+"\n"), 0o644)
		_, err := LoadManifest(spec)
		if !errors.Is(err, ErrInvalidManifest) || !strings.Contains(err.Error(), `m.jsonl:1: field "inputs"`) || !strings.Contains(err.Error(), "no such file") {
			t.Fatalf("%s: got %v, want the missing input named with its line and field", tc.input, err)
		}
		if tc.want == "" {
			if strings.Contains(err.Error(), "not expanded") {
				t.Errorf("%s: got %v, want no expansion hint", tc.input, err)
			}
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want it to say %q", tc.input, err, tc.want)
		}
	}
}

// TestUnexpandedSpecPathsAreRefused: `output = "~/results"` was taken as
// written and made a directory named "~" beside the spec, where every
// output then landed (found by hand). A spec path that a shell would
// have expanded is refused with the path it would have made; one that
// names such a directory on purpose ("./~") is taken.
func TestUnexpandedSpecPathsAreRefused(t *testing.T) {
	dir := t.TempDir()
	home, _ := os.UserHomeDir()
	t.Setenv("SP_TEST_DATA", "/data/proj")
	os.Unsetenv("SP_TEST_UNSET")
	specPath := filepath.Join(dir, "shardpool.toml")
	for _, tc := range []struct{ field, value, want string }{
		{"output", "~/results", `field "output": invalid run spec: "~/results": a leading ~ is not expanded`},
		{"output", "~/results", fmt.Sprintf("(%q here)", filepath.Join(home, "results"))},
		{"output", "~alice/results", `a leading ~ is not expanded`},
		{"output", "$SP_TEST_DATA/out", `environment variables are not expanded (paths are taken as written, relative to the spec's directory); write the full path ("/data/proj/out" here)`},
		{"output", "${SP_TEST_DATA}/out", `("/data/proj/out" here)`},
		{"output", "$SP_TEST_UNSET/out", `environment variables are not expanded (paths are taken as written, relative to the spec's directory); write the full path`},
		{"manifest", "~/m.jsonl", `field "manifest": invalid run spec: "~/m.jsonl": a leading ~ is not expanded`},
		{"output", "./~", ""},
		{"output", "out~1", ""},
		{"output", "price$", ""},
	} {
		spec := map[string]string{"manifest": "m.jsonl", "output": "o"}
		spec[tc.field] = tc.value
		src := fmt.Sprintf("name = \"x\"\nmanifest = %q\noutput = %q\ncommand = [\"true\"]\n", spec["manifest"], spec["output"])
		os.WriteFile(specPath, []byte(src), 0o644)
		s, err := LoadSpec(specPath)
		if tc.want == "" {
			if err != nil {
				t.Errorf("%s = %q: %v, want it taken", tc.field, tc.value, err)
			} else if s.Output != filepath.Join(dir, tc.value) {
				t.Errorf("%s = %q: output %s, want it beside the spec", tc.field, tc.value, s.Output)
			}
			continue
		}
		if !errors.Is(err, ErrInvalidSpec) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s = %q: got %v, want an error containing %q", tc.field, tc.value, err, tc.want)
			continue
		}
		if strings.Contains(tc.value, "UNSET") && strings.Contains(err.Error(), "here)") {
			t.Errorf("%s = %q: got %v, want no expansion suggested for an unset variable", tc.field, tc.value, err)
		}
	}
}

// TestShellLineAsProgramIsRefused: command = ["gzip -c", "{input}"] was
// accepted and every attempt failed to start ("executable file not
// found"), on every host, after its retries. A program name with spaces
// and no directory is a shell line in one string: refused at load with
// the argv it meant. A path with a directory may hold a space.
func TestShellLineAsProgramIsRefused(t *testing.T) {
	for _, tc := range []struct {
		argv []string
		want string
	}{
		{[]string{"gzip -c", "{input}"}, `program "gzip -c" has spaces: the command is an argv array, not a shell line, so it would be looked up as one name; write ["gzip", "-c", "{input}"]`},
		{[]string{"python3 train.py --lr 0.1"}, `write ["python3", "train.py", "--lr", "0.1"]`},
		{[]string{"/opt/My App/bin/tool", "{id}"}, ""},
		{[]string{"sh", "-c", "gzip -c x | wc"}, ""},
	} {
		err := checkArgv(tc.argv)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q: %v, want it taken", tc.argv, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%q: got %v, want an error containing %q", tc.argv, err, tc.want)
		}
	}
}

// TestPlaceholdersInEnv: a value of env that names placeholders is
// expanded for each attempt as inside a command's argument (a job whose
// program reads HF_HOME or OUTPUT_DIR needs no wrapper script); before,
// "{out}" reached the command as those five characters. {input} in env
// needs exactly one input, as in the command or the validator.
func TestPlaceholdersInEnv(t *testing.T) {
	env := map[string]string{"OUT": "{out}", "HF_HOME": "{scratch}/hf-{id}", "TRY": "{attempt}", "IN": "{input}", "AWK": "{print $1}", "PLAIN": "x"}
	got, err := ExpandEnv(env, Vars{ID: "s1", Out: "/o", Scratch: "/s", Inputs: []string{"/in/a"}, Attempt: 2})
	want := []string{"HF_HOME=/s/hf-s1", "IN=/in/a", "OUT=/o", "TRY=2"}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("ExpandEnv: got %q, %v; want %q", got, err, want)
	}
	if got, err := ExpandEnv(map[string]string{"PLAIN": "x", "AWK": "{print $1}"}, Vars{}); err != nil || got != nil {
		t.Fatalf("ExpandEnv without placeholders: got %q, %v; want nil", got, err)
	}
	if _, err := ExpandEnv(map[string]string{"IN": "{input}"}, Vars{Inputs: []string{"a", "b"}}); !errors.Is(err, ErrPlaceholder) || !strings.Contains(err.Error(), "env IN") {
		t.Fatalf("ExpandEnv of {input} with two inputs: got %v, want ErrPlaceholder naming env IN", err)
	}

	dir := t.TempDir()
	spec := filepath.Join(dir, "shardpool.toml")
	os.WriteFile(spec, []byte("name = \"x\"\nmanifest = \"m.jsonl\"\noutput = \"o\"\ncommand = [\"true\"]\nenv = { IN = \"{input}\" }\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "a"), []byte("x"), 0o644)
	os.WriteFile(filepath.Join(dir, "m.jsonl"), []byte("{\"id\":\"one\",\"inputs\":[\"a\"]}\n{\"id\":\"two\",\"inputs\":[\"a\",\"a\"]}\n"), 0o644)
	sp, err := LoadSpec(spec)
	if err != nil {
		t.Fatal(err)
	}
	_, err = LoadManifest(sp)
	if !errors.Is(err, ErrInvalidManifest) || !strings.Contains(err.Error(), `m.jsonl:2: field "inputs"`) || !strings.Contains(err.Error(), "env IN uses {input}, which needs exactly one input, and this shard has 2") {
		t.Fatalf("a shard of two inputs where env uses {input}: got %v, want line 2 refused naming env IN", err)
	}
}

// TestADirectoryInputSaysWhatToDo: inputs are files (staged, checksummed
// and stamped one by one). A directory is refused at its line with the
// two ways a job reads one: its files listed, or the directory as a param.
func TestADirectoryInputSaysWhatToDo(t *testing.T) {
	spec, dir := specWithCommand(t, `["ls", "{input}"]`)
	if err := os.Mkdir(filepath.Join(dir, "images"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "m.jsonl"), []byte(`{"id":"s","inputs":["images"]}`+"\n"), 0o644)
	_, err := LoadManifest(spec)
	if !errors.Is(err, ErrInvalidManifest) || !strings.Contains(err.Error(), `m.jsonl:1: field "inputs"`) ||
		!strings.Contains(err.Error(), "is a directory, want a file: list its files in inputs") || !strings.Contains(err.Error(), `"params": {"dir": "images"}`) ||
		!strings.Contains(err.Error(), "$SHARDPOOL_PARAM_DIR") {
		t.Fatalf("got %v, want the directory refused at its line, with its files or a param as the ways to pass it", err)
	}
}
