package stream

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// Fingerprint is xxhash64 over the canonical spec (command, env, classes,
// validator, outputs, the checksums of local files they name), code_rev and the
// manifest's content hash. Output location,
// retries and timeouts are left out: changing them does not change what a
// shard computes.
func Fingerprint(s *Spec, manifestHash string) string {
	canon := struct {
		Command   []string          `json:"command"`
		Env       map[string]string `json:"env"`
		Classes   map[string]Class  `json:"classes"`
		Validator []string          `json:"validator"`
		CodeRev   string            `json:"code_rev"`
		Manifest  string            `json:"manifest"`
		Files     map[string]string `json:"files,omitempty"`
		// Absent when empty, so that runs of specs without outputs keep
		// the fingerprints they had before the key existed.
		Outputs []string `json:"outputs,omitempty"`
	}{s.Command, s.Env, s.Classes, s.Validator, s.CodeRev, manifestHash, s.Files, s.Outputs}
	// encoding/json sorts map keys, which makes this canonical.
	b, err := json.Marshal(canon)
	if err != nil {
		panic(fmt.Sprintf("fingerprint: marshal of plain data failed: %v", err))
	}
	return fmt.Sprintf("%016x", xxhash.Sum64(b))
}

// ChangeManifest is GenerationChanges' entry for a manifest whose content
// changed (lines added, removed or edited).
const ChangeManifest = "manifest content"

// GenerationChanges says, in words, which inputs of the fingerprint differ
// between a run's previous generation (old, with its manifest hash) and a
// new spec: what a user changed to make the run start over. It is empty
// when the fingerprints agree.
func GenerationChanges(old *Spec, oldManifest string, cur *Spec, curManifest string) []string {
	var out []string
	if !slices.Equal(old.Command, cur.Command) {
		out = append(out, fmt.Sprintf("command %q, was %q", strings.Join(cur.Command, " "), strings.Join(old.Command, " ")))
	}
	for _, k := range changedKeys(old.Env, cur.Env, func(a, b string) bool { return a == b }) {
		out = append(out, "env "+k)
	}
	for _, k := range changedKeys(old.Classes, cur.Classes, func(a, b Class) bool { return reflect.DeepEqual(a, b) }) {
		out = append(out, "class "+k)
	}
	if !slices.Equal(old.Validator, cur.Validator) {
		out = append(out, "validator")
	}
	if !slices.Equal(old.Outputs, cur.Outputs) {
		out = append(out, "outputs")
	}
	if old.CodeRev != cur.CodeRev {
		out = append(out, fmt.Sprintf("code_rev %s, was %s", orNone(cur.CodeRev), orNone(old.CodeRev)))
	}
	if oldManifest != curManifest {
		out = append(out, ChangeManifest)
	}
	for _, k := range changedKeys(old.Files, cur.Files, func(a, b string) bool { return a == b }) {
		_, was := old.Files[k]
		_, is := cur.Files[k]
		switch {
		case !was:
			out = append(out, "file "+k+" (now read)")
		case !is:
			out = append(out, "file "+k+" (no longer read)")
		default:
			out = append(out, "file "+k)
		}
	}
	return out
}

// changedKeys lists, sorted, the keys present in only one of a and b or
// with values that differ.
func changedKeys[V any](a, b map[string]V, same func(V, V) bool) []string {
	var keys []string
	for k, av := range a {
		if bv, ok := b[k]; !ok || !same(av, bv) {
			keys = append(keys, k)
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}
