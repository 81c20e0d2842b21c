package stream

import (
	"slices"
	"testing"
)

// TestGenerationChangesNameWhatChanged: every input of the fingerprint
// that differs is named, and a spec that differs only outside it (output,
// retries) names nothing and keeps its fingerprint.
func TestGenerationChangesNameWhatChanged(t *testing.T) {
	base := func() *Spec {
		return &Spec{Command: []string{"./job.sh", "{input}"}, Env: map[string]string{"A": "1"},
			Classes: map[string]Class{"cpu": {CPUs: 1}}, CodeRev: "abc", Files: map[string]string{"./job.sh": "01"},
			Output: "out", Retries: 1}
	}
	for _, tc := range []struct {
		name     string
		change   func(*Spec)
		manifest string
		want     []string
	}{
		{"nothing", func(*Spec) {}, "m", nil},
		{"outside the fingerprint", func(s *Spec) { s.Output, s.Retries = "elsewhere", 5 }, "m", nil},
		{"command", func(s *Spec) { s.Command = []string{"./job.sh", "-v", "{input}"} }, "m",
			[]string{`command "./job.sh -v {input}", was "./job.sh {input}"`}},
		{"env", func(s *Spec) { s.Env = map[string]string{"A": "2", "B": "x"} }, "m", []string{"env A", "env B"}},
		{"class", func(s *Spec) { s.Classes["cpu"] = Class{CPUs: 2} }, "m", []string{"class cpu"}},
		{"validator", func(s *Spec) { s.Validator = []string{"./check.sh"} }, "m", []string{"validator"}},
		{"outputs", func(s *Spec) { s.Outputs = []string{"{id}.gz"} }, "m", []string{"outputs"}},
		{"code_rev", func(s *Spec) { s.CodeRev = "" }, "m", []string{"code_rev (none), was abc"}},
		{"manifest", func(*Spec) {}, "m2", []string{"manifest content"}},
		{"file edited", func(s *Spec) { s.Files = map[string]string{"./job.sh": "02"} }, "m", []string{"file ./job.sh"}},
		{"file no longer read", func(s *Spec) { s.Files = nil }, "m", []string{"file ./job.sh (no longer read)"}},
		{"file now read", func(s *Spec) { s.Files["conf.yaml"] = "03" }, "m", []string{"file conf.yaml (now read)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old, cur := base(), base()
			tc.change(cur)
			got := GenerationChanges(old, "m", cur, tc.manifest)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
			if same := Fingerprint(old, "m") == Fingerprint(cur, tc.manifest); same != (len(tc.want) == 0) {
				t.Fatalf("fingerprints equal: %v, but changes named: %q", same, got)
			}
		})
	}
}

// TestFingerprintOfASpecWithoutOutputsIsUnchanged: the outputs key, added
// later, enters the fingerprint only when set, so a run submitted again
// by a newer shardpool is the same generation, not redone. The value is
// what the code before the key computed for this spec.
func TestFingerprintOfASpecWithoutOutputsIsUnchanged(t *testing.T) {
	s := &Spec{Command: []string{"./job.sh", "{input}"}, Env: map[string]string{"A": "1"},
		Classes: map[string]Class{"cpu": {CPUs: 1, Memory: 1 << 20}}, Validator: []string{"./check.sh"}, CodeRev: "abc",
		Files: map[string]string{"./job.sh": "01"}}
	if got, want := Fingerprint(s, "m"), "746d549f8ec65933"; got != want {
		t.Fatalf("fingerprint %s, want %s as before outputs existed", got, want)
	}
}
