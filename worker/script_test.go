package worker_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/testenv"
	"github.com/shardpool/shardpool/worker"
)

// TestScriptProblem: scripts that exec would not run are named with
// the cause; programs and scripts it runs, and files it cannot judge,
// are not.
func TestScriptProblem(t *testing.T) {
	dir := t.TempDir()
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatal(err)
	}
	trueBin, err := exec.LookPath("true")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, body, want string
	}{
		{"shebang", "#!" + sh + "\necho hi\n", ""},
		{"shebang with a space", "#! " + sh + " -e\necho hi\n", ""},
		{"env finds sh", "#!/usr/bin/env sh\necho hi\n", ""},
		{"env with an option", "#!/usr/bin/env -S no-such-program -u\n", ""},
		{"binary", "\x00\x01\x02binary", ""},
		{"empty", "", ""},
		{"no shebang", "echo hi\n", "is a text file with no #! line"},
		{"CRLF", "#!" + sh + "\r\necho hi\r\n", `its #! line ends in a carriage return, so the kernel looks for an interpreter named "` + sh + `\r"`},
		{"empty shebang", "#!\necho hi\n", "has an empty #! line"},
		{"missing interpreter", "#!/no/such/bin/python3\n", "names the interpreter /no/such/bin/python3 on its #! line, which is not on this host"},
		{"interpreter a directory", "#!/\n", "names the interpreter / on its #! line, which is not an executable file"},
		{"env finds nothing", "#!/usr/bin/env no-such-program-here\n", "runs with #!/usr/bin/env no-such-program-here, and no-such-program-here is not on this host's PATH"},
	} {
		path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-"))
		if err := os.WriteFile(path, []byte(tc.body), 0o755); err != nil {
			t.Fatal(err)
		}
		got, _ := worker.ScriptProblem(path, exec.LookPath)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%s: got %q, want %q", tc.name, got, tc.want)
		}
	}
	if got, _ := worker.ScriptProblem(trueBin, exec.LookPath); got != "" {
		t.Errorf("%s (ELF): got %q, want nothing", trueBin, got)
	}
	if got, _ := worker.ScriptProblem(filepath.Join(dir, "absent"), exec.LookPath); got != "" {
		t.Errorf("a file that is not there: got %q, want nothing (exec says it)", got)
	}
	// Without a lookup (the command's PATH is its own), env's program is
	// not judged.
	if got, _ := worker.ScriptProblem(filepath.Join(dir, "env-finds-nothing"), nil); got != "" {
		t.Errorf("env's program without a lookup: got %q, want nothing", got)
	}
}

// TestScriptWithAMissingInterpreterSaysSo: where the spec was checked on
// another host (submit), a worker whose host lacks a script's
// interpreter recorded "fork/exec ./job.py: no such file or directory",
// of a file that is there. The attempt's reason names the interpreter.
func TestScriptWithAMissingInterpreterSaysSo(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	spec := testenv.WriteJob(t, testenv.Job{Shards: 1, Retries: 0, Command: []string{"./job.py", "{out}"}})
	if err := os.WriteFile(filepath.Join(filepath.Dir(spec), "job.py"), []byte("#!/no/such/conda/bin/python\nprint(1)\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("t", 30*time.Second, stream.RunBlocked)
	sh, _ := env.Shard("t", "s0000")
	if len(sh.Attempts) == 0 || !strings.Contains(sh.Attempts[len(sh.Attempts)-1].Reason, "names the interpreter /no/such/conda/bin/python on its #! line, which is not on this host") {
		t.Fatalf("the attempt's reason: %+v, want it to name the missing interpreter", sh.Attempts)
	}
}
