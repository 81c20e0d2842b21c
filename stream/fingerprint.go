package stream

import (
	"encoding/json"
	"fmt"

	"github.com/cespare/xxhash/v2"
)

// Fingerprint is xxhash64 over the canonical spec (command, env, classes,
// validator, the checksums of local files they name), code_rev and the
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
	}{s.Command, s.Env, s.Classes, s.Validator, s.CodeRev, manifestHash, s.Files}
	// encoding/json sorts map keys, which makes this canonical.
	b, err := json.Marshal(canon)
	if err != nil {
		panic(fmt.Sprintf("fingerprint: marshal of plain data failed: %v", err))
	}
	return fmt.Sprintf("%016x", xxhash.Sum64(b))
}
