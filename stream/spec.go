package stream

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/pelletier/go-toml/v2"
)

// DefaultClass is the class of a manifest line that names none.
const DefaultClass = "cpu"

// Spec is a validated run spec with every path made absolute. It is stored in
// the run record, so workers on other hosts run exactly what was submitted.
type Spec struct {
	Name     string            `json:"name"`
	SpecPath string            `json:"spec_path"`
	Dir      string            `json:"dir"`
	Manifest string            `json:"manifest"`
	Output   string            `json:"output"`
	Command  []string          `json:"command"`
	Env      map[string]string `json:"env,omitempty"`
	Retries  int               `json:"retries"`
	Timeout  Seconds           `json:"timeout"`
	// RetryDelay is how long a shard waits after its first failed attempt
	// before the next; each later retry waits twice the one before, at
	// most RetryDelayMaxFactor times it. Zero: the worker's own (1 s,
	// doubling to a minute).
	RetryDelay Seconds `json:"retry_delay,omitempty"`
	CodeRev    string  `json:"code_rev"`
	Stage      bool    `json:"stage"`
	// Pack says whether a staged shard of many small inputs is packed
	// into one file at submit: nil (the default) where its inputs are
	// not on local storage, true always, false never.
	Pack      *bool    `json:"pack,omitempty"`
	Validator []string `json:"validator,omitempty"`
	// Outputs are patterns (path.Match, relative to {out}; {id} is the
	// shard's ID) that must each match a file or directory in {out} after
	// exit 0, or the attempt's output is invalid.
	Outputs []string `json:"outputs,omitempty"`
	// Files are the checksums of the files that the command and validator
	// name by relative path (a script, a config; see localFiles).
	Files   map[string]string `json:"files,omitempty"`
	Classes map[string]Class  `json:"classes"`
	Profile ProfileSpec       `json:"profile"`
}

// ProfileSpec is the [profile] table: what `shardpool profile` runs
// besides the smallest, median and largest shard.
type ProfileSpec struct {
	// Malformed inputs (paths) that must make the command fail cleanly.
	Malformed []string `json:"malformed,omitempty"`
	// Sustained is how many shards the sustained sample runs after a
	// warm-up. Default 4.
	Sustained int `json:"sustained"`
}

// Class is one resource class of a spec. Sizes are bytes.
type Class struct {
	CPUs    int     `json:"cpus"`
	Memory  int64   `json:"memory"`
	GPUs    int     `json:"gpus"`
	VRAM    int64   `json:"vram"`
	Time    Seconds `json:"time"`
	Scratch int64   `json:"scratch"`
	Stage   *bool   `json:"stage,omitempty"`
}

// StageFor reports whether shards of class stage their inputs first.
func (s *Spec) StageFor(class string) bool {
	if c, ok := s.Classes[class]; ok && c.Stage != nil {
		return *c.Stage
	}
	return s.Stage
}

// TimeoutFor is the per-attempt limit for a class: the class's time if set,
// else the spec's timeout (zero means none).
func (s *Spec) TimeoutFor(class string) time.Duration {
	if c, ok := s.Classes[class]; ok && c.Time > 0 {
		return c.Time.D()
	}
	return s.Timeout.D()
}

type specFile struct {
	Name       string               `toml:"name"`
	Manifest   string               `toml:"manifest"`
	Output     string               `toml:"output"`
	Command    []string             `toml:"command"`
	Env        map[string]string    `toml:"env"`
	Retries    *int                 `toml:"retries"`
	Timeout    string               `toml:"timeout"`
	RetryDelay string               `toml:"retry_delay"`
	CodeRev    *string              `toml:"code_rev"`
	Stage      bool                 `toml:"stage"`
	Pack       *bool                `toml:"pack"`
	Validator  []string             `toml:"validator"`
	Outputs    []string             `toml:"outputs"`
	Class      map[string]classFile `toml:"class"`
	Profile    struct {
		Malformed []string `toml:"malformed"`
		Sustained *int     `toml:"sustained"`
	} `toml:"profile"`
}

type classFile struct {
	CPUs    *int   `toml:"cpus"`
	Memory  string `toml:"memory"`
	GPUs    int    `toml:"gpus"`
	VRAM    string `toml:"vram"`
	Time    string `toml:"time"`
	Scratch string `toml:"scratch"`
	Stage   *bool  `toml:"stage"`
}

// knownHere says which keys the table of an unknown key accepts, and
// which of them the key was probably meant to be: "class" for "classes",
// "memory" for "memroy".
func knownHere(key []string) string {
	t := reflect.TypeFor[specFile]()
	typo := ""
	for i := 0; i < len(key); i++ {
		next := tomlField(t, key[i])
		if next == nil {
			typo = key[i]
			break
		}
		t = next
		if t.Kind() == reflect.Map {
			// The next element names the map entry ([class.gpu]).
			t, i = t.Elem(), i+1
		}
	}
	if typo == "" || t.Kind() != reflect.Struct {
		return ""
	}
	var known []string
	for i := range t.NumField() {
		if name, _, _ := strings.Cut(t.Field(i).Tag.Get("toml"), ","); name != "" {
			known = append(known, name)
		}
	}
	sort.Strings(known)
	msg := " (known here: " + strings.Join(known, ", ") + ")"
	if len(key) > 1 && t != reflect.TypeFor[specFile]() && tomlField(reflect.TypeFor[specFile](), typo) != nil {
		// A top-level key written below a [table] header belongs to that
		// table in TOML.
		return fmt.Sprintf(": %q is a top-level key: in TOML every key after a [table] header belongs to that table, so put it above the first one%s", typo, msg)
	}
	if k := likelyMeant(strings.ToLower(typo), known); k != "" {
		return fmt.Sprintf(": %q, did you mean %q?%s", typo, k, msg)
	}
	return fmt.Sprintf(": %q%s", typo, msg)
}

// likelyMeant is the known key closest to typo when it is close enough:
// one edit away (two where either is longer than four letters), or the same word
// with another ending ("retry" for "retries"). Of two as close, the one
// that shares the longer beginning wins ("ouput" is "out", not "input").
func likelyMeant(typo string, known []string) string {
	best, bestD, bestP := "", 0, 0
	for _, k := range known {
		d := editDistance(typo, k)
		limit := 1
		if max(len(k), len(typo)) > 4 {
			limit = 2
		}
		p := 0
		for p < min(len(k), len(typo)) && k[p] == typo[p] {
			p++
		}
		sameStem := p >= 4 && max(len(k), len(typo))-p <= 3
		if (d <= limit || sameStem) && (best == "" || d < bestD || d == bestD && p > bestP) {
			best, bestD, bestP = k, d, p
		}
	}
	return best
}

// tomlField is the type of struct t's field tagged name, or nil.
func tomlField(t reflect.Type, name string) reflect.Type {
	if t.Kind() != reflect.Struct {
		return nil
	}
	for i := range t.NumField() {
		if tag, _, _ := strings.Cut(t.Field(i).Tag.Get("toml"), ","); tag == name {
			return t.Field(i).Type
		}
	}
	return nil
}

// editDistance is the optimal string alignment distance of a and b
// (insertions, deletions, substitutions and swaps of neighbours, bytes).
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// DefaultRetries is used when the spec does not say.
const DefaultRetries = 2

// MaxRetryDelay bounds retry_delay: a shard that waits longer between its
// attempts is better retried by hand (--retry-failed).
const MaxRetryDelay = 24 * time.Hour

// RetryDelayMaxFactor bounds the doubling of retry_delay: the longest
// wait is this many times it (a minute for the worker's default of 1 s).
const RetryDelayMaxFactor = 60

// RetryDelayAfter is how long a shard waits after its n-th failed attempt
// (n from 1) under retry_delay: doubled for each retry after the first, at
// most RetryDelayMaxFactor times it. Zero when the spec sets none.
func (s *Spec) RetryDelayAfter(n int) time.Duration {
	base := s.RetryDelay.D()
	if base <= 0 {
		return 0
	}
	return Doubled(base, base*RetryDelayMaxFactor, n)
}

// Doubled is base doubled for each n after the first, at most most: the
// delay before the retry that follows the n-th failed attempt.
func Doubled(base, most time.Duration, n int) time.Duration {
	d := base
	for i := 1; i < n && d < most; i++ {
		d *= 2
	}
	return min(d, most)
}

// LoadSpec reads and validates the spec at path. Every error wraps
// ErrInvalidSpec and names the file, the line when it is known, and the field.
func LoadSpec(path string) (*Spec, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %v", path, ErrInvalidSpec, err)
	}
	src, err := os.ReadFile(abs)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidSpec, err)
	}
	// A byte order mark is not TOML, but editors write one.
	return parseSpec(abs, bytes.TrimPrefix(src, utf8BOM))
}

func parseSpec(abs string, src []byte) (*Spec, error) {
	// Every field is checked, so one try shows all there is to fix, as
	// the manifest's lines are; a field that does not decode at all (a
	// string where an array goes) stops the check, as nothing after it is
	// known.
	var errs specErrors
	bad := func(table, key, format string, args ...any) {
		loc, n := abs, LineOf(src, table, key)
		if n > 0 {
			loc = fmt.Sprintf("%s:%d", abs, n)
		}
		field := key
		switch {
		case key == "":
			field = table
		case table != "":
			field = table + "." + key
		}
		errs.add(n, fmt.Errorf("%s: field %q: %w: %s", loc, field, ErrInvalidSpec, fmt.Sprintf(format, args...)))
	}
	var f specFile
	dec := toml.NewDecoder(bytes.NewReader(src)).DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		var sm *toml.StrictMissingError
		var de *toml.DecodeError
		switch {
		case errors.As(err, &sm) && len(sm.Errors) > 0:
			// The known fields are decoded all the same: they are
			// checked below with the unknown ones reported.
			for _, e := range sm.Errors {
				row, _ := e.Position()
				errs.add(row, fmt.Errorf("%s:%d: field %q: %w: unknown field%s", abs, row, strings.Join(e.Key(), "."), ErrInvalidSpec, knownHere(e.Key())))
			}
		case errors.As(err, &de):
			row, col := de.Position()
			field := strings.Join(de.Key(), ".")
			return nil, fmt.Errorf("%s:%d:%d: field %q: %w: %s", abs, row, col, field, ErrInvalidSpec, explainTOMLType(strings.TrimPrefix(de.Error(), "toml: "), field))
		default:
			return nil, fmt.Errorf("%s: %w: %v", abs, ErrInvalidSpec, err)
		}
	}
	dir := filepath.Dir(abs)
	s := &Spec{SpecPath: abs, Dir: dir, Env: f.Env, Stage: f.Stage, Pack: f.Pack, Classes: map[string]Class{}}
	if !ValidRunName(f.Name) {
		bad("", "name", "%q must match [a-z0-9][a-z0-9-]* (at most 64 characters)", f.Name)
	}
	s.Name = f.Name
	if f.Manifest == "" {
		bad("", "manifest", "missing: the path of the JSONL manifest")
	} else if why := unexpanded(f.Manifest); why != "" {
		bad("", "manifest", "%s", why)
	}
	s.Manifest = resolve(dir, f.Manifest)
	s.Output = filepath.Clean(resolve(dir, f.Output))
	if f.Output == "" {
		bad("", "output", "missing: the durable output directory")
	} else if why := unexpanded(f.Output); why != "" {
		// Taken as written, it would make a directory named "~" or
		// "$HOME" beside the spec, and the outputs would land there.
		bad("", "output", "%s", why)
	} else if s.Output == "/" {
		bad("", "output", "the output directory cannot be /")
	}
	if len(f.Command) == 0 || f.Command[0] == "" {
		bad("", "command", "missing: an argv array such as [\"gzip\", \"-k\", \"{input}\"]")
	} else if err := checkArgv(f.Command); err != nil {
		bad("", "command", "%v", err)
	}
	s.Command = f.Command
	if len(f.Validator) > 0 {
		if err := checkArgv(f.Validator); err != nil {
			bad("", "validator", "%v", err)
		}
		s.Validator = f.Validator
	}
	for i, o := range f.Outputs {
		if err := checkOutput(o); err != nil {
			bad("", "outputs", "entry %d (%q): %v", i, o, err)
		}
	}
	s.Outputs = f.Outputs
	for _, k := range slices.Sorted(maps.Keys(f.Env)) {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			bad("env", k, "not a valid environment variable name")
		} else if strings.ContainsRune(f.Env[k], 0) {
			// No variable can hold one: every attempt failed to start.
			bad("env", k, "the value holds a NUL character, which no environment variable can hold")
		} else if strings.Contains(f.Env[k], "{inputs}") {
			// Placeholders in a value are expanded as in one argument.
			bad("env", k, "%q: {inputs} stands for one argument per input and has no place in one variable; name the inputs in command, or use {input} where each shard has one", f.Env[k])
		} else if why := checkBraces(f.Env[k]); why != "" {
			bad("env", k, "%q: %s", f.Env[k], why)
		}
	}
	s.Retries = DefaultRetries
	if f.Retries != nil {
		if *f.Retries < 0 || *f.Retries > 100 {
			bad("", "retries", "%d is outside 0..100", *f.Retries)
		}
		s.Retries = *f.Retries
	}
	if f.Timeout != "" {
		d, err := time.ParseDuration(f.Timeout)
		if err != nil || d <= 0 {
			bad("", "timeout", "%q is not a positive Go duration such as \"90s\" or \"2h\"", f.Timeout)
		}
		s.Timeout = Seconds(d)
	}
	if f.RetryDelay != "" {
		d, err := time.ParseDuration(f.RetryDelay)
		if err != nil || d <= 0 || d > MaxRetryDelay {
			bad("", "retry_delay", "%q is not a Go duration from 1ns to %s such as \"30s\" or \"5m\"", f.RetryDelay, MaxRetryDelay)
		}
		s.RetryDelay = Seconds(d)
	}
	for _, name := range slices.Sorted(maps.Keys(f.Class)) {
		c, tbl := f.Class[name], "class."+name
		if !ValidClass(name) {
			bad(tbl, "", "class name must match [a-z0-9][a-z0-9_-]* (at most 32 characters)")
		}
		var k Class
		k.CPUs = 1
		if c.CPUs != nil {
			if *c.CPUs < 1 {
				bad(tbl, "cpus", "%d: want at least 1", *c.CPUs)
			}
			k.CPUs = *c.CPUs
		}
		if c.GPUs < 0 {
			bad(tbl, "gpus", "%d: want 0 or more", c.GPUs)
		}
		k.GPUs = c.GPUs
		for _, sz := range []struct {
			key string
			val string
			dst *int64
		}{{"memory", c.Memory, &k.Memory}, {"vram", c.VRAM, &k.VRAM}, {"scratch", c.Scratch, &k.Scratch}} {
			if sz.val == "" {
				continue
			}
			v, err := ParseSize(sz.val)
			if err != nil {
				bad(tbl, sz.key, "%v", err)
			}
			*sz.dst = v
		}
		if c.Time != "" {
			d, err := time.ParseDuration(c.Time)
			if err != nil || d <= 0 {
				bad(tbl, "time", "%q is not a positive Go duration", c.Time)
			}
			k.Time = Seconds(d)
		}
		k.Stage = c.Stage
		s.Classes[name] = k
	}
	if _, ok := s.Classes[DefaultClass]; !ok {
		s.Classes[DefaultClass] = Class{CPUs: 1}
	}
	s.Profile.Sustained = 4
	if f.Profile.Sustained != nil {
		if *f.Profile.Sustained < 1 || *f.Profile.Sustained > 1000 {
			bad("profile", "sustained", "%d is outside 1..1000", *f.Profile.Sustained)
		}
		s.Profile.Sustained = *f.Profile.Sustained
	}
	for i, m := range f.Profile.Malformed {
		p := resolve(dir, m)
		if _, err := os.Stat(p); err != nil {
			bad("profile", "malformed", "input %d: %v%s", i, err, unexpandedHint(m))
		}
		s.Profile.Malformed = append(s.Profile.Malformed, p)
	}
	if err := errs.err(abs); err != nil {
		return nil, err
	}
	// What the fingerprint takes from the spec's directory, once the spec
	// is known to be valid.
	if f.CodeRev != nil {
		s.CodeRev = *f.CodeRev
	} else {
		s.CodeRev = gitRev(dir)
	}
	s.Files = localFiles(dir, s.Command, s.Validator)
	return s, nil
}

// specErrors collects what is wrong with a spec, each with its line (0
// where the line is not known).
type specErrors struct {
	list []lineError
}

type lineError struct {
	line int
	err  error
}

func (e *specErrors) add(line int, err error) { e.list = append(e.list, lineError{line, err}) }

// err is nil, the one error, or every error in line order below a line
// that counts them, as LoadManifest reports a manifest's.
func (e *specErrors) err(path string) error {
	switch len(e.list) {
	case 0:
		return nil
	case 1:
		return e.list[0].err
	}
	// Those whose line is not known go last.
	at := func(le lineError) int {
		if le.line <= 0 {
			return math.MaxInt
		}
		return le.line
	}
	slices.SortStableFunc(e.list, func(a, b lineError) int { return cmp.Compare(at(a), at(b)) })
	errs := []error{fmt.Errorf("%s: %w: %d problems, each below", path, ErrInvalidSpec, len(e.list))}
	for _, le := range e.list {
		errs = append(errs, le.err)
	}
	return errors.Join(errs...)
}

// ClassNames returns the spec's classes in a stable order.
func (s *Spec) ClassNames() []string {
	names := make([]string, 0, len(s.Classes))
	for n := range s.Classes {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// unexpanded says why a path that a shell would have expanded is refused:
// a spec or manifest is no shell, so a leading ~ or a $VARIABLE would be
// taken as written, relative to the spec's directory. It suggests the
// path the shell would have made, where this process can tell it. A
// directory that is really named ~ is written "./~"; a $NAME in a path
// is refused wherever it stands.
func unexpanded(p string) string {
	switch {
	case p == "~" || strings.HasPrefix(p, "~/"):
		want := "the full path"
		if home, err := os.UserHomeDir(); err == nil && home != "" {
			want = fmt.Sprintf("the full path (%q here)", filepath.Join(home, strings.TrimPrefix(p, "~")))
		}
		return fmt.Sprintf("%q: a leading ~ is not expanded (paths are taken as written, relative to the spec's directory); write %s, or \"./%s\" where a directory is really named ~", p, want, p)
	case strings.HasPrefix(p, "~"):
		return fmt.Sprintf("%q: a leading ~ is not expanded (paths are taken as written, relative to the spec's directory); write the full path, or \"./%s\" where a directory is really named so", p, p)
	case shellVarRE.MatchString(p):
		want := "the full path"
		if x := os.Expand(p, os.Getenv); !strings.Contains(x, "$") && !strings.Contains(p, "$$") && allSet(p) {
			want = fmt.Sprintf("the full path (%q here)", x)
		}
		return fmt.Sprintf("%q: environment variables are not expanded (paths are taken as written, relative to the spec's directory); write %s", p, want)
	}
	return ""
}

// unexpandedHint is unexpanded's reason as a note to an error about a
// path that was not found, where a file may really have such a name.
func unexpandedHint(p string) string {
	if strings.HasPrefix(p, "~") {
		return " (a leading ~ is not expanded: paths are taken as written, relative to the spec's directory; write the full path)"
	}
	if shellVarRE.MatchString(p) {
		return " (environment variables are not expanded: paths are taken as written, relative to the spec's directory; write the full path)"
	}
	return ""
}

// shellVarRE finds what a shell would expand as a variable: $NAME or
// ${...}.
var shellVarRE = regexp.MustCompile(`\$(\{|[A-Za-z_])`)

// allSet reports whether every variable p names is set here.
func allSet(p string) bool {
	ok := true
	os.Expand(p, func(k string) string {
		if _, set := os.LookupEnv(k); !set {
			ok = false
		}
		return ""
	})
	return ok
}

func resolve(dir, p string) string {
	if filepath.IsAbs(p) {
		return filepath.Clean(p)
	}
	return filepath.Join(dir, p)
}

// placeholders are the names Expand substitutes; placeholderRE finds
// them, braceRE what looks like one.
var (
	placeholders  = []string{"id", "input", "inputs", "out", "ckpt", "scratch", "attempt"}
	placeholderRE = regexp.MustCompile(`\{(` + strings.Join(placeholders, "|") + `)\}`)
	braceRE       = regexp.MustCompile(`\{([a-z_]+)\}`)
	// paramRefRE finds a manifest param named the way templates name
	// them: {param.n}, {params.n}, {param:n}, {params[n]}, {params['n']}.
	paramRefRE = regexp.MustCompile(`\{\s*params?\s*(?:[.:]\s*([A-Za-z0-9_-]+)|\[\s*["']?([^"'\]]+?)["']?\s*\])\s*\}`)
)

func checkArgv(argv []string) error {
	// A shell line in one string: its program would be looked up as
	// "python3 train.py" and fail at every attempt, on every host. A
	// program name with a space and no directory is no program anyone
	// has; one with a directory may be a real path ("/opt/My App/tool").
	if prog := argv[0]; strings.ContainsAny(prog, " \t\n") && !strings.Contains(prog, "/") {
		var split []string
		for _, a := range append(strings.Fields(prog), argv[1:]...) {
			split = append(split, strconv.Quote(a))
		}
		return fmt.Errorf("program %q has spaces: the command is an argv array, not a shell line, so it would be looked up as one name; write [%s] (pipes, redirects and globs belong in a script the command runs)",
			prog, strings.Join(split, ", "))
	}
	for i, a := range argv {
		if strings.Contains(a, "{inputs}") && a != "{inputs}" {
			return fmt.Errorf("argument %d (%q): {inputs} expands to one argument per input, so it must stand alone", i, a)
		}
		if strings.ContainsRune(a, 0) {
			return fmt.Errorf("argument %d contains a NUL byte", i)
		}
		if why := checkBraces(a); why != "" {
			return fmt.Errorf("argument %d (%q): %s", i, a, why)
		}
	}
	return nil
}

// checkBraces says what is wrong with the braces of a, an argument of a
// command or a value of env, or "". Other braces pass through (an awk
// program), but a word of three letters or more a letter or two from a
// placeholder is a typo that would reach every shard as it is, and so is
// a shorter one that stands alone and begins a placeholder ("{in}").
// Params are no placeholders: written the way templates name them
// ({param.n}), a param reached every shard's command as that text, and a
// command that did not fail on it validated with nothing done.
func checkBraces(a string) string {
	if m := paramRefRE.FindStringSubmatch(a); m != nil {
		env := ParamEnv(m[1] + m[2])
		return fmt.Sprintf("%s is not a placeholder: params reach the command as environment variables, this one as %s (in a shell: \"$%s\"); that text would reach every shard's command as it is", m[0], env, env)
	}
	for _, m := range braceRE.FindAllStringSubmatch(a, -1) {
		if slices.Contains(placeholders, m[1]) {
			continue
		}
		if m[1] == "param" || m[1] == "params" {
			return fmt.Sprintf("%s is not a placeholder: params reach the command as environment variables, SHARDPOOL_PARAM_ and the key upper-cased (in a shell: \"$SHARDPOOL_PARAM_N\" for param n); that text would reach every shard's command as it is", m[0])
		}
		if len(m[1]) < 3 {
			if k := beginning(m[1], placeholders); k != "" && a == m[0] && len(m[1]) > 1 {
				return fmt.Sprintf("%s is not a placeholder; did you mean {%s}? (text in braces that is meant as it is belongs in a script the command runs)", m[0], k)
			}
			continue
		}
		if k := likelyMeant(m[1], placeholders); k != "" {
			return fmt.Sprintf("%s is not a placeholder; did you mean {%s}? (text in braces that is meant as it is belongs in a script the command runs)", m[0], k)
		}
	}
	return ""
}

// beginning is the first of names that w begins, or "".
func beginning(w string, names []string) string {
	for _, n := range names {
		if strings.HasPrefix(n, w) {
			return n
		}
	}
	return ""
}

// checkOutput checks one pattern of the spec's outputs: a path inside
// {out}, with shell-style wildcards (path.Match) and {id} as the only
// placeholder.
func checkOutput(o string) error {
	if o == "" {
		return errors.New("empty: a path inside {out} such as \"{id}.gz\" or \"*.csv\"")
	}
	for _, m := range braceRE.FindAllStringSubmatch(o, -1) {
		if m[1] == "id" || (len(m[1]) < 3 && !slices.Contains(placeholders, m[1])) {
			continue // {id}, or braces meant as they are
		}
		if slices.Contains(placeholders, m[1]) || likelyMeant(m[1], placeholders) != "" {
			return fmt.Errorf("%s is not allowed here: outputs are paths inside {out}, and {id} is the only placeholder they take", m[0])
		}
	}
	p := strings.ReplaceAll(o, "{id}", "x")
	if !fs.ValidPath(p) || p == "." {
		return errors.New("not a path inside {out}: give it relative to {out}, without \"..\", \".\" or a leading or trailing \"/\"")
	}
	if _, err := path.Match(p, ""); err != nil {
		return fmt.Errorf("not a valid pattern (%v): * ? and [...] are wildcards as in the shell, \\ escapes one", err)
	}
	return nil
}

// MissingOutputs names the patterns of outputs (see Spec.Outputs) that
// match nothing in the directory out, for the shard id.
func MissingOutputs(out string, outputs []string, id string) []string {
	var missing []string
	fsys := os.DirFS(out)
	for _, o := range outputs {
		p := strings.ReplaceAll(o, "{id}", id)
		if m, err := fs.Glob(fsys, p); err != nil || len(m) == 0 {
			missing = append(missing, p)
		}
	}
	return missing
}

// At names where the spec sets key of table ("" for the top level):
// "path:line", or the path alone when that line cannot be found (the file
// changed or is unreadable since it was loaded).
func (s *Spec) At(table, key string) string {
	src, err := os.ReadFile(s.SpecPath)
	if err != nil {
		return s.SpecPath
	}
	if n := LineOf(bytes.TrimPrefix(src, utf8BOM), table, key); n > 0 {
		return fmt.Sprintf("%s:%d", s.SpecPath, n)
	}
	return s.SpecPath
}

// LineOf finds the 1-based line of a TOML file that sets key inside table
// ("" for the top level; key "" for the table's header), or 0: the line an
// error about that field names. It is a reader for error messages, not a
// TOML parser.
func LineOf(src []byte, table, key string) int {
	cur := ""
	keyRE := regexp.MustCompile(`^\s*"?` + regexp.QuoteMeta(key) + `"?\s*=`)
	for i, line := range strings.Split(string(src), "\n") {
		t := strings.TrimSpace(line)
		if strings.HasPrefix(t, "[") && !strings.HasPrefix(t, "[[") {
			cur = strings.Trim(strings.SplitN(t, "]", 2)[0], "[ ")
			if table != "" && cur == table && key == "" {
				return i + 1
			}
			continue
		}
		if cur == table && keyRE.MatchString(line) {
			return i + 1
		}
		// class.<name> may also be written inline as a key of [class].
		if table != "" && strings.HasPrefix(table, cur+".") && cur != "" && keyRE.MatchString(line) {
			return i + 1
		}
	}
	if table != "" && key != "" {
		if n := LineOf(src, table, ""); n > 0 {
			return n
		}
		// An inline table: env = { X = "..." } sets env.X on env's line.
		parent, last := "", table
		if i := strings.LastIndex(table, "."); i >= 0 {
			parent, last = table[:i], table[i+1:]
		}
		return LineOf(src, parent, last)
	}
	return 0
}

// gitRev is the HEAD commit of dir's git checkout, or "" when dir is not one
// or git is missing. A failure here is not an error: code_rev is optional.
// Uncommitted changes to tracked files add "+dirty." and a checksum of the
// diff: the code that runs is not HEAD's, and an edit must not be taken
// for the revision whose outputs are already committed.
func gitRev(dir string) string {
	out, err := exec.Command("git", "-C", dir, "rev-parse", "HEAD").Output()
	if err != nil {
		return ""
	}
	rev := strings.TrimSpace(string(out))
	diff, err := exec.Command("git", "-C", dir, "diff", "--binary", "HEAD").Output()
	if err != nil || len(diff) == 0 {
		return rev
	}
	return fmt.Sprintf("%s+dirty.%016x", rev, xxhash.Sum64(diff))
}

// maxHashedFile bounds the files localFiles reads.
const maxHashedFile = 1 << 20

// localFiles checksums the regular files (up to maxHashedFile) that argv
// elements name by a path relative to the spec's directory: the job's
// script or config, whose edit is a changed command even where code_rev
// does not see it (no git checkout, or an explicit code_rev). Absolute
// paths (system programs), options and placeholders are left out.
func localFiles(dir string, argvs ...[]string) map[string]string {
	var out map[string]string
	for _, argv := range argvs {
		for _, a := range argv {
			if a == "" || filepath.IsAbs(a) || strings.HasPrefix(a, "-") || strings.Contains(a, "{") {
				continue
			}
			p := filepath.Join(dir, a)
			fi, err := os.Stat(p)
			if err != nil || !fi.Mode().IsRegular() || fi.Size() > maxHashedFile {
				continue
			}
			b, err := os.ReadFile(p)
			if err != nil {
				continue
			}
			if out == nil {
				out = map[string]string{}
			}
			out[a] = fmt.Sprintf("%016x", xxhash.Sum64(b))
		}
	}
	return out
}

// tomlTypeError is the TOML decoder's message for a value of the wrong
// type; it names Go's types, which a spec's author never wrote.
var tomlTypeError = regexp.MustCompile(`^cannot decode TOML (\w+) into struct field .* of type (\S+)$`)

// explainTOMLType says a type error in the spec's terms ("got a string,
// want an array of strings such as ..."); other messages pass as they are.
func explainTOMLType(msg, field string) string {
	m := tomlTypeError.FindStringSubmatch(msg)
	if m == nil {
		return msg
	}
	want := map[string]string{
		"int": "a whole number", "string": "a string", "bool": "true or false",
		"[]string": "an array of strings", "map[string]string": "a table of strings",
	}[strings.TrimPrefix(m[2], "*")]
	switch {
	case field == "class":
		// A shard's class is named in the manifest; the spec's class is a
		// table of class tables.
		want = `a table of classes such as [class.gpu] with gpus = 1 under it (a shard's class is the "class" field of its manifest line)`
	case strings.HasPrefix(field, "class.") && strings.Count(field, ".") == 1:
		want = "a table such as [class.gpu] with the class's cpus, memory, gpus, vram, time, scratch and stage"
	case want == "":
		return msg // a type this function has no words for
	case field == "command" || field == "validator":
		want = `an argv array such as ["gzip", "-k", "{input}"], never a shell string`
	case field == "outputs":
		want = `an array of paths inside {out} such as ["{id}.gz", "*.csv"]`
	case strings.HasSuffix(field, ".cpus"):
		want = "a whole number of CPUs, at least 1"
	case strings.HasSuffix(field, ".gpus"):
		want = "a whole number of GPUs"
	case m[2] == "string" && slices.Contains([]string{"memory", "vram", "scratch"}, last(field)):
		want = `a size such as "512MiB" or "2GiB"`
	case m[2] == "string" && slices.Contains([]string{"timeout", "time", "retry_delay"}, last(field)):
		want = `a duration such as "90s" or "2h"`
	case field == "env" && m[2] == "string":
		want = `a string for each variable (quote numbers: { N = "4" })`
	case field == "env":
		want = `a table of strings such as { MODE = "fast" }`
	}
	got := "a " + m[1]
	if strings.ContainsRune("aeiou", rune(m[1][0])) {
		got = "an " + m[1]
	}
	return fmt.Sprintf("got %s, want %s", got, want)
}

// last is a dotted field's last part.
func last(field string) string { return field[strings.LastIndexByte(field, '.')+1:] }
