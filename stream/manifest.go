package stream

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"sort"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// Shard is one validated manifest line with absolute input paths.
type Shard struct {
	ID     string            `json:"id"`
	Inputs []string          `json:"inputs"`
	Class  string            `json:"class"`
	Cost   int64             `json:"cost"`
	Params map[string]string `json:"params,omitempty"`
	Line   int               `json:"line"`
	// Files describes Inputs when the shard's class stages (set by submit).
	Files []InputFile `json:"files,omitempty"`
}

// Manifest is a validated manifest: its shards in file order and the
// xxhash64 of its bytes, which enters the run fingerprint.
type Manifest struct {
	Path   string
	Hash   string
	Shards []Shard
}

// ParamEnv is the environment variable a manifest param's key becomes in
// the command's environment: SHARDPOOL_PARAM_ and the key upper-cased,
// with each character other than an ASCII letter, digit or _ turned into _, so
// that a shell can read it ("batch-size" is $SHARDPOOL_PARAM_BATCH_SIZE).
// The manifest refuses two keys of one shard that become the same name.
func ParamEnv(key string) string {
	b := make([]byte, 0, len("SHARDPOOL_PARAM_")+len(key))
	b = append(b, "SHARDPOOL_PARAM_"...)
	for _, c := range key {
		switch {
		case c >= 'a' && c <= 'z':
			b = append(b, byte(c-'a'+'A'))
		case c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_':
			b = append(b, byte(c))
		default:
			b = append(b, '_')
		}
	}
	return string(b)
}

// MaxShardBytes bounds what a shard's input paths and params may take in
// its message: the server's payload limit is 8 MiB, a staged shard's
// message grows by a description of each input, and {inputs} expands to
// a command line that the kernel bounds too (ARG_MAX, 2 MiB by default).
const MaxShardBytes = 1 << 20

// messageBytes is about what a shard's inputs and params take in its
// JSON message.
func messageBytes(sh *Shard) int {
	n := 0
	for _, in := range sh.Inputs {
		n += len(in) + 3
	}
	for k, v := range sh.Params {
		n += len(k) + len(v) + 6
	}
	return n
}

// maxManifestErrors bounds the invalid lines one load reports.
const maxManifestErrors = 20

var manifestFields = map[string]bool{"id": true, "inputs": true, "class": true, "cost": true, "params": true}

// utf8BOM is the byte order mark some editors put at the start of a file.
var utf8BOM = []byte{0xEF, 0xBB, 0xBF}

// LoadManifest reads the JSONL manifest of spec. Relative input paths are
// relative to the spec's directory. Inputs must exist and be readable
// regular files; classes must be declared by the spec. Every error wraps
// ErrInvalidManifest and names the file, line and field; one load reports
// the first 20 invalid lines (one per line) and counts the rest.
func LoadManifest(spec *Spec) (*Manifest, error) {
	// A manifest that cannot be read is named where it is set: the
	// spec's line that gives the path.
	unreadable := func(why string) error {
		if spec.SpecPath == "" {
			return fmt.Errorf("%w: %s", ErrInvalidManifest, why)
		}
		return fmt.Errorf("%s: field \"manifest\": %w: %s", spec.At("", "manifest"), ErrInvalidManifest, why)
	}
	f, err := os.Open(spec.Manifest)
	if err != nil {
		return nil, unreadable(err.Error())
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.IsDir() {
		// Opened all the same.
		return nil, unreadable(spec.Manifest + " is a directory; want the JSONL manifest, one shard a line")
	}
	h := xxhash.New()
	m := &Manifest{Path: spec.Manifest}
	seen := map[string]int{}
	// Every line is checked, so one pass shows what to fix; the first
	// maxManifestErrors errors are reported and the rest counted.
	var errs []error
	invalid := 0
	report := func(err error) {
		if invalid++; len(errs) < maxManifestErrors {
			errs = append(errs, err)
		}
	}
	r := bufio.NewReaderSize(io.TeeReader(f, h), 1<<16)
	for n := 1; ; n++ {
		line, err := r.ReadBytes('\n')
		if n == 1 {
			// A UTF-8 byte order mark, as some Windows editors write; JSON
			// parsers may ignore it (RFC 8259). The fingerprint keeps the
			// file's bytes as they are.
			line = bytes.TrimPrefix(line, utf8BOM)
		}
		if len(line) > 0 {
			sh, perr := parseLine(spec, m.Path, n, line)
			switch {
			case perr != nil:
				report(perr)
			case sh == nil:
			case seen[sh.ID] > 0:
				report(fmt.Errorf("%s:%d: field \"id\": %w: duplicate shard id %q (first on line %d)", m.Path, n, ErrInvalidManifest, sh.ID, seen[sh.ID]))
			default:
				seen[sh.ID] = n
				m.Shards = append(m.Shards, *sh)
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w: %v", m.Path, n, ErrInvalidManifest, err)
		}
	}
	if invalid > 1 {
		shown := "each below"
		if invalid > len(errs) {
			shown = fmt.Sprintf("the first %d below", len(errs))
		}
		head := fmt.Errorf("%s: %w: %d invalid lines, %s", m.Path, ErrInvalidManifest, invalid, shown)
		errs = append([]error{head}, errs...)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if len(m.Shards) == 0 {
		return nil, fmt.Errorf("%s: %w: no shards", m.Path, ErrInvalidManifest)
	}
	m.Hash = fmt.Sprintf("%016x", h.Sum64())
	return m, nil
}

// ManifestIDs reads only the shard ids of a manifest (with the default
// ids of lines without one) and the xxhash of its bytes, which a run record
// keeps as its manifest_hash: a caller can tell whether the file is still
// the one that run published. Lines that do not parse are skipped; this is
// not validation.
func ManifestIDs(path string) (map[string]bool, string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, "", err
	}
	defer f.Close()
	h := xxhash.New()
	ids := map[string]bool{}
	r := bufio.NewReaderSize(io.TeeReader(f, h), 1<<16)
	for n := 1; ; n++ {
		line, err := r.ReadBytes('\n')
		if n == 1 {
			line = bytes.TrimPrefix(line, utf8BOM) // as LoadManifest does
		}
		if t := bytes.TrimSpace(line); len(t) > 0 {
			var sh struct {
				ID *string `json:"id"`
			}
			if json.Unmarshal(t, &sh) == nil {
				if sh.ID != nil {
					ids[*sh.ID] = true
				} else {
					ids[defaultShardID(n)] = true
				}
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, "", err
		}
	}
	return ids, fmt.Sprintf("%016x", h.Sum64()), nil
}

// defaultShardID is the id of a manifest line that names none.
func defaultShardID(line int) string { return fmt.Sprintf("line-%06d", line) }

func parseLine(spec *Spec, path string, n int, line []byte) (*Shard, error) {
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%s:%d: field %q: %w: %s", path, n, field, ErrInvalidManifest, fmt.Sprintf(format, args...))
	}
	t := bytes.TrimSpace(line)
	if len(t) == 0 {
		return nil, nil
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(t, &raw); err != nil {
		var se *json.SyntaxError
		if e, ok := err.(*json.SyntaxError); ok {
			se = e
			return nil, fmt.Errorf("%s:%d:%d: %w: not a JSON object: %v", path, n, se.Offset, ErrInvalidManifest, err)
		}
		return nil, fmt.Errorf("%s:%d: %w: not a JSON object: %v", path, n, ErrInvalidManifest, err)
	}
	if k, ok := repeatedKey(t, len(raw)); ok {
		return nil, bad(k, "given twice on this line (JSON would keep the last one only): give it once")
	}
	keys := make([]string, 0, len(raw))
	for k := range raw {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if !manifestFields[k] {
			known := slices.Sorted(maps.Keys(manifestFields))
			if m := likelyMeant(strings.ToLower(k), known); m != "" {
				return nil, bad(k, "unknown field, did you mean %q? (known: %s)", m, strings.Join(known, ", "))
			}
			return nil, bad(k, "unknown field (known: %s)", strings.Join(known, ", "))
		}
	}
	sh := &Shard{Line: n, Class: DefaultClass}
	if v, ok := raw["id"]; ok {
		if err := json.Unmarshal(v, &sh.ID); err != nil {
			return nil, bad("id", "want a string")
		}
		if !ValidShardID(sh.ID) {
			return nil, bad("id", "%q must match [A-Za-z0-9_-]{1,128}; it names the shard's output directory", sh.ID)
		}
	} else {
		sh.ID = defaultShardID(n)
	}
	if v, ok := raw["inputs"]; ok {
		if err := json.Unmarshal(v, &sh.Inputs); err != nil {
			return nil, bad("inputs", "want an array of paths")
		}
	}
	if v, ok := raw["class"]; ok {
		if err := json.Unmarshal(v, &sh.Class); err != nil {
			return nil, bad("class", "want a string")
		}
		if _, ok := spec.Classes[sh.Class]; !ok {
			return nil, bad("class", "class %q is not declared in %s (declare [class.%s])", sh.Class, spec.SpecPath, sh.Class)
		}
	}
	if v, ok := raw["params"]; ok {
		params, err := parseParams(v)
		if err != nil {
			return nil, bad("params", "%v", err)
		}
		sh.Params = params
		if k, ok := repeatedKey(v, len(sh.Params)); ok {
			return nil, bad("params", "key %q given twice (JSON would keep the last one only): give it once", k)
		}
		keys := slices.Sorted(maps.Keys(sh.Params))
		names := make(map[string]string, len(keys))
		for _, k := range keys {
			if k == "" || strings.ContainsAny(k, "=\x00") {
				return nil, bad("params", "key %q cannot become an environment variable", k)
			}
			name := ParamEnv(k)
			if other, ok := names[name]; ok {
				return nil, bad("params", "keys %q and %q both become the variable %s (letters are upper-cased, characters other than ASCII letters, digits and _ become _): rename one", other, k, name)
			}
			names[name] = k
			if err := paramAsPlaceholder(spec, k, name); err != nil {
				return nil, bad("params", "%v", err)
			}
		}
	}
	var total int64
	for i, in := range sh.Inputs {
		if in == "" {
			return nil, bad("inputs", "input %d is empty", i)
		}
		p := resolve(spec.Dir, in)
		st, err := os.Stat(p)
		if err != nil {
			return nil, bad("inputs", "input %d: %v%s", i, err, unexpandedHint(in))
		}
		if st.IsDir() {
			// Inputs are files: staged, checksummed and stamped one by
			// one. A directory the command reads in place is a param.
			return nil, bad("inputs", "input %d: %s is a directory, want a file: list its files in inputs (a shard runs again when one of them changes), "+
				"or, for a directory the command reads in place, pass it as a param (\"params\": {\"dir\": %q}, which the command finds in $SHARDPOOL_PARAM_DIR; "+
				"neither staged nor checked for changes)", i, p, in)
		}
		sh.Inputs[i] = p
		total += st.Size()
	}
	if n := messageBytes(sh); n > MaxShardBytes {
		return nil, bad("inputs", "the shard's input paths and params come to %s; a shard's message holds at most %s "+
			"(it travels through JetStream, and its {inputs} become one command line): split it into several shards, "+
			"or list its inputs in a file that the command reads", FormatSize(int64(n)), FormatSize(MaxShardBytes))
	}
	sh.Cost = total
	if v, ok := raw["cost"]; ok {
		if err := json.Unmarshal(v, &sh.Cost); err != nil || sh.Cost < 0 {
			return nil, bad("cost", "want a non-negative integer")
		}
	}
	if err := checkPlaceholders(spec, sh); err != nil {
		return nil, bad("inputs", "%v", err)
	}
	return sh, nil
}

// parseParams reads a manifest line's params: an object whose values
// reach the command as environment variables. A string is taken as it
// is; a number or a boolean as its JSON text, as written (`0.001`, `1e-3`,
// `true`: a sweep's learning rate or flag needs no quotes); null as an
// empty string. An object or an array, which no variable holds, and a
// value with a NUL byte, which none can hold, are refused by key.
func parseParams(v json.RawMessage) (map[string]string, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(v, &raw); err != nil {
		return nil, errors.New("want an object of strings, numbers or booleans")
	}
	params := make(map[string]string, len(raw))
	for _, k := range slices.Sorted(maps.Keys(raw)) {
		val := bytes.TrimSpace(raw[k])
		switch {
		case len(val) > 0 && val[0] == '"':
			var str string
			if err := json.Unmarshal(val, &str); err != nil {
				return nil, fmt.Errorf("key %q: %v", k, err)
			}
			if strings.ContainsRune(str, 0) {
				return nil, fmt.Errorf("key %q: the value holds a NUL character, which no environment variable can hold", k)
			}
			params[k] = str
		case string(val) == "null":
			params[k] = ""
		case len(val) > 0 && (val[0] == '{' || val[0] == '['):
			kind := "an object"
			if val[0] == '[' {
				kind = "an array"
			}
			return nil, fmt.Errorf("key %q holds %s: params reach the command as environment variables, "+
				"so give a string, a number or a boolean (a structure can travel JSON-encoded in a string, or in a file the command reads)", k, kind)
		default: // a number, true or false: valid JSON, so nothing else
			params[k] = string(val)
		}
	}
	return params, nil
}

// paramAsPlaceholder refuses a param whose key the spec's command,
// validator or env names in braces, {n} for param n: params are no placeholders,
// so the braces reached every shard's command as they are (a shell loop
// "while [ $i -lt {n} ]" failed its test, ran no step and exited 0, and
// every shard validated with nothing done).
func paramAsPlaceholder(spec *Spec, key, env string) error {
	word := "{" + key + "}"
	for _, argv := range []struct {
		field string
		args  []string
	}{{"command", spec.Command}, {"validator", spec.Validator}} {
		for i, a := range argv.args {
			if strings.Contains(a, word) {
				return fmt.Errorf("key %q appears as %s in argument %d of the %s in %s, but params are not placeholders: that text would reach the command as it is; "+
					"a param reaches the command as the environment variable %s (in a shell: \"$%s\")", key, word, i, argv.field, spec.SpecPath, env, env)
			}
		}
	}
	for _, k := range slices.Sorted(maps.Keys(spec.Env)) {
		if strings.Contains(spec.Env[k], word) {
			return fmt.Errorf("key %q appears as %s in env %s in %s, but params are not placeholders: that text would reach the command as it is; "+
				"a param reaches the command as the environment variable %s", key, word, k, spec.SpecPath, env)
		}
	}
	return nil
}

// checkPlaceholders refuses a shard that its command, validator or env
// cannot be expanded for: {input} where it has not exactly one input.
func checkPlaceholders(spec *Spec, sh *Shard) error {
	if len(sh.Inputs) == 1 {
		return nil
	}
	for _, argv := range []struct {
		field string
		args  []string
	}{{"command", spec.Command}, {"validator", spec.Validator}} {
		for _, a := range argv.args {
			if strings.Contains(a, "{input}") {
				return fmt.Errorf("%w: the %s uses {input}, which needs exactly one input, and this shard has %d (use {inputs})", ErrPlaceholder, argv.field, len(sh.Inputs))
			}
		}
	}
	for _, k := range slices.Sorted(maps.Keys(spec.Env)) {
		if strings.Contains(spec.Env[k], "{input}") {
			return fmt.Errorf("%w: env %s uses {input}, which needs exactly one input, and this shard has %d", ErrPlaceholder, k, len(sh.Inputs))
		}
	}
	return nil
}

// ExpandEnv is the spec's env entries whose values name placeholders,
// expanded for one attempt as KEY=value, sorted; nil where none does.
// They are expanded as inside a command's argument ({inputs} is refused
// in env when the spec loads).
func ExpandEnv(env map[string]string, v Vars) ([]string, error) {
	var out []string
	for k, val := range env {
		if !strings.Contains(val, "{") || !placeholderRE.MatchString(val) {
			continue
		}
		e, err := Expand([]string{val}, v)
		if err == nil && len(e) != 1 {
			err = fmt.Errorf("%w: %q is not one value", ErrPlaceholder, val)
		}
		if err != nil {
			return nil, fmt.Errorf("env %s: %w", k, err)
		}
		out = append(out, k+"="+e[0])
	}
	sort.Strings(out)
	return out, nil
}

// Vars are the values of a command's placeholders for one attempt.
type Vars struct {
	ID, Out, Ckpt, Scratch string
	Inputs                 []string
	Attempt                int
}

// Expand substitutes placeholders in argv. {inputs} must stand alone and
// becomes one argument per input; other placeholders are replaced inside
// arguments. Unknown braces are left alone (awk programs stay intact).
func Expand(argv []string, v Vars) ([]string, error) {
	out := make([]string, 0, len(argv)+len(v.Inputs))
	for _, a := range argv {
		if a == "{inputs}" {
			out = append(out, v.Inputs...)
			continue
		}
		var err error
		s := placeholderRE.ReplaceAllStringFunc(a, func(m string) string {
			switch m {
			case "{id}":
				return v.ID
			case "{input}":
				if len(v.Inputs) != 1 {
					err = fmt.Errorf("%w: {input} with %d inputs", ErrPlaceholder, len(v.Inputs))
					return m
				}
				return v.Inputs[0]
			case "{out}":
				return v.Out
			case "{ckpt}":
				return v.Ckpt
			case "{scratch}":
				return v.Scratch
			case "{attempt}":
				return fmt.Sprint(v.Attempt)
			}
			return m
		})
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// repeatedKey finds a key given twice in obj, a JSON object that has
// decoded into a map of distinct keys. encoding/json keeps the last of
// repeated keys without a word, so a line with "inputs" twice would run
// on the second list alone. The common case costs one scan that counts
// the object's own keys, without allocating; only where the count
// exceeds distinct are the keys decoded to name the repeated one.
func repeatedKey(obj []byte, distinct int) (string, bool) {
	if countKeys(obj, nil) <= distinct {
		return "", false
	}
	seen := map[string]bool{}
	var rep string
	found := false
	countKeys(obj, func(raw []byte) bool {
		var k string
		if json.Unmarshal(raw, &k) != nil {
			return true
		}
		if seen[k] {
			rep, found = k, true
			return false
		}
		seen[k] = true
		return true
	})
	return rep, found
}

// countKeys counts the keys of the outermost object of obj (valid JSON),
// passing each key's quoted bytes to each when it is set; each returning
// false stops the scan.
func countKeys(obj []byte, each func(raw []byte) bool) int {
	n, depth := 0, 0
	expectKey := false
	for i := 0; i < len(obj); i++ {
		switch c := obj[i]; c {
		case '"':
			start := i
			for i++; i < len(obj) && obj[i] != '"'; i++ {
				if obj[i] == '\\' {
					i++
				}
			}
			if depth == 1 && expectKey {
				n++
				expectKey = false
				if each != nil && !each(obj[start:i+1]) {
					return n
				}
			}
		case '{', '[':
			depth++
			expectKey = c == '{' && depth == 1
		case '}', ']':
			depth--
		case ',':
			expectKey = depth == 1
		}
	}
	return n
}
