package main_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardpool/shardpool/testenv"
)

// TestPolicyTiersFollowTheHostName: one policy file, as in a home
// directory every host mounts, read by workers on hosts of other names
// (each in a UTS namespace of its own). Each worker takes the scratch of
// the tier its host name matches, and a host that no tier matches, whose
// top-level scratch it lacks, refuses to start and says why.
func TestPolicyTiersFollowTheHostName(t *testing.T) {
	testenv.RequireRoot(t)
	c := startCluster(t, "5s")
	cfg, base := t.TempDir(), t.TempDir()
	dirs := map[string]string{"login1": filepath.Join(base, "login-scratch"), "box": filepath.Join(base, "box-scratch")}
	for _, d := range dirs {
		os.Mkdir(d, 0o755)
	}
	missing := filepath.Join(base, "no-such-scratch")
	policy := filepath.Join(cfg, "shardpool", "policy.toml")
	os.MkdirAll(filepath.Dir(policy), 0o755)
	os.WriteFile(policy, []byte(fmt.Sprintf(`scratch = [%q]

[tier.login]
hosts = ["login*"]
scratch = [%q]

[tier.box]
hosts = ["box", "box.lab.example.org"]
scratch = [%q]
`, missing, dirs["login1"], dirs["box"])), 0o644)
	env := []string{"XDG_CONFIG_HOME=" + cfg}
	start := func(host string) *testenv.Proc {
		return testenv.StartOnHost(t, host, env, "worker", "--server", c.url, "--token-file", c.token(),
			"--data", filepath.Join(c.data, "w-"+host), "--slots", "1", "--grace", "2s")
	}

	other := start("other")
	if code := other.Wait(t, 30*time.Second); code != 1 {
		t.Fatalf("worker on host other: exit %d, want 1\n%s", code, other.Output())
	}
	if o := other.Output(); !strings.Contains(o, missing+" does not exist") || !strings.Contains(o, policy) {
		t.Fatalf("worker on host other does not say which scratch of which policy it lacks:\n%s", o)
	}

	for host := range dirs {
		w := start(host)
		testenv.Eventually(t, 20*time.Second, func() (bool, string) {
			return strings.Contains(w.Output(), "serving"), "worker output: " + w.Output()
		})
	}
	spec := testenv.WriteJob(t, testenv.Job{Shards: 6, Command: []string{"sh", "-c", `echo "$1" > "$1/where"; sleep 0.5`, "sh", "{out}"}})
	c.submit(spec)
	c.completesOnce(spec, 6, 90*time.Second)

	ran := map[string]int{}
	for i := range 6 {
		id := fmt.Sprintf("s%04d", i)
		rec, err := testenv.ReadShard(c.js, "t", id)
		if err != nil || len(rec.Attempts) == 0 {
			t.Fatalf("%s: record %+v, %v", id, rec, err)
		}
		host := rec.Attempts[len(rec.Attempts)-1].Worker // the default name: the host name
		b, err := os.ReadFile(filepath.Join(filepath.Dir(spec), "out", id, "where"))
		if err != nil {
			t.Fatal(err)
		}
		want := filepath.Join(dirs[host], fmt.Sprintf("shardpool-%s-%d", host, os.Getuid()), "t") + "/"
		if got := strings.TrimSpace(string(b)); dirs[host] == "" || !strings.HasPrefix(got, want) {
			t.Errorf("%s ran on %s in %s, want under %s (its tier's scratch)", id, host, got, want)
		}
		ran[host]++
	}
	if ran["login1"] == 0 || ran["box"] == 0 {
		t.Errorf("shards per host: %v; want each tier's host to have run some (both served with one slot)", ran)
	}
}
