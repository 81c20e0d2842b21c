package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/shardpool/shardpool/coordinator/plan"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker"
)

// newFlags makes a FlagSet whose --help prints synopsis and flags.
func newFlags(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	// The flag package prints a bad flag's error, then calls Usage; a
	// --help calls Usage alone. After an error the usage is its synopsis
	// and where the flags are listed, so that the error stays in sight
	// rather than above forty lines of flags.
	out := &wroteWriter{w: stderr}
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: %s\n", synopsis)
		n := 0
		fs.VisitAll(func(*flag.Flag) { n++ })
		switch {
		case n == 0:
		case out.wrote:
			fmt.Fprintf(stderr, "shardpool %s --help lists its flags\n", name)
		default:
			fmt.Fprintf(stderr, "\nFlags:\n")
			printFlags(stderr, fs)
		}
		if exits := commandExits[name]; len(exits) > 0 && !out.wrote {
			fmt.Fprintf(stderr, "\nExit codes:\n")
			for _, e := range exits {
				code, what, _ := strings.Cut(e, " ")
				fmt.Fprintf(stderr, "  %-4s %s\n", code, what)
			}
		}
	}
	return fs
}

// wroteWriter says whether the flag package has written to it: an error
// about a flag, before it calls Usage.
type wroteWriter struct {
	w     io.Writer
	wrote bool
}

func (w *wroteWriter) Write(p []byte) (int, error) {
	w.wrote = true
	return w.w.Write(p)
}

// printFlags lists fs's flags as flag.PrintDefaults does (which decides
// what each default is and how to show it), spelt with two dashes (one
// for a single letter) as the synopses, the docs and every error message
// spell them, and each usage on a line of its own. A back-quoted word in
// a flag's usage names its argument (`FILE`); other quoting in a usage
// must not use back quotes.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	var b strings.Builder
	out := fs.Output()
	fs.SetOutput(&b)
	fs.PrintDefaults()
	fs.SetOutput(out)
	for _, line := range strings.SplitAfter(b.String(), "\n") {
		switch {
		case !strings.HasPrefix(line, "  -"):
		case len(line) > 4 && !strings.ContainsRune(" \t\n", rune(line[4])):
			line = "  --" + line[3:]
		default:
			// A single letter: PrintDefaults puts a short head's usage
			// after a tab on the same line.
			line = strings.Replace(line, "\t", "\n    \t", 1)
		}
		io.WriteString(w, line)
	}
}

// parse accepts flags before and after positional arguments.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if err == flag.ErrHelp {
				return nil, errHelp
			}
			return nil, errUsage
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	// No duration flag means anything below zero: --grace -1s and
	// --lease-ttl -5s ran with their defaults, saying nothing.
	var negative *flag.Flag
	fs.Visit(func(f *flag.Flag) {
		if g, ok := f.Value.(flag.Getter); ok && negative == nil {
			if d, ok := g.Get().(time.Duration); ok && d < 0 {
				negative = f
			}
		}
	})
	if negative != nil {
		fmt.Fprintf(fs.Output(), "invalid value %q for flag -%s: want a duration of 0 or more\n", negative.Value.String(), negative.Name)
		fs.Usage()
		return nil, errUsage
	}
	return pos, nil
}

// parseArgs parses a command that takes exactly n positional arguments:
// another count prints the usage.
func parseArgs(fs *flag.FlagSet, args []string, n int) ([]string, error) {
	pos, err := parse(fs, args)
	if err != nil {
		return nil, err
	}
	if len(pos) != n {
		return nil, wrongCount(fs, pos, arguments(n))
	}
	return pos, nil
}

// arguments is n arguments in words: "no argument", "1 argument".
func arguments(n int) string {
	switch n {
	case 0:
		return "no argument"
	case 1:
		return "1 argument"
	}
	return fmt.Sprintf("%d arguments", n)
}

// wrongCount prints the usage for a command given the positional
// arguments pos where it takes want ("1 argument"), and returns errUsage.
// The bare command prints the whole usage, as --help; a wrong number is
// said first (a flag's value left out can make its argument positional).
func wrongCount(fs *flag.FlagSet, pos []string, want string) error {
	if len(pos) > 0 {
		fmt.Fprintf(fs.Output(), "shardpool %s: takes %s, got %d: %s\n", fs.Name(), want, len(pos), strings.Join(pos, " "))
	}
	fs.Usage()
	return errUsage
}

// parseNone parses a command that takes flags only: a positional argument
// prints the usage.
func parseNone(fs *flag.FlagSet, args []string) error {
	_, err := parseArgs(fs, args, 0)
	return err
}

// errHelp is returned after --help printed the usage: exit 0.
var errHelp = exitErr{code: exitOK}

// slotsFlag parses "auto", "cpu=4,gpu=1" or a bare "4" (for every class).
type slotsFlag struct {
	auto    bool
	all     int
	byClass map[string]int
}

func (s *slotsFlag) String() string {
	if s == nil {
		return ""
	}
	if s.auto {
		return "auto"
	}
	if len(s.byClass) == 0 {
		return strconv.Itoa(s.all)
	}
	var parts []string
	for k, v := range s.byClass {
		parts = append(parts, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(parts) // the same spelling each time: it goes into resume.txt
	return strings.Join(parts, ",")
}

func (s *slotsFlag) Set(v string) error {
	s.auto = v == "auto"
	if s.auto {
		s.all, s.byClass = 0, nil
		return nil
	}
	if n, err := strconv.Atoi(v); err == nil {
		if n < 1 {
			return fmt.Errorf("slots %d: want at least 1", n)
		}
		s.all = n
		return nil
	}
	s.byClass = map[string]int{}
	for _, p := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(strings.TrimSpace(p), "=")
		n, err := strconv.Atoi(val)
		if !ok || err != nil || n < 0 || k == "" {
			return fmt.Errorf("slots %q: want N or CLASS=N,CLASS=N", v)
		}
		if _, dup := s.byClass[k]; dup {
			return fmt.Errorf("slots %q: class %s is given twice", v, k)
		}
		s.byClass[k] = n
	}
	return nil
}

// describe is what a worker serves, in words.
func (s *slotsFlag) describe() string {
	if n := s.each(); n > 0 {
		return fmt.Sprintf("%d slot(s) of each class of the active runs", n)
	}
	return s.String()
}

// each is N of a plain `--slots N`, for a worker that learns its classes
// from the runs; 0 for auto or CLASS=N,....
func (s *slotsFlag) each() int {
	if s.auto || len(s.byClass) > 0 {
		return 0
	}
	return s.all
}

// forClasses resolves the flag for the given classes.
func (s *slotsFlag) forClasses(classes []string) map[string]int {
	out := map[string]int{}
	if len(s.byClass) > 0 {
		for k, v := range s.byClass {
			out[k] = v
		}
		return out
	}
	for _, c := range classes {
		out[c] = s.all
	}
	return out
}

// coverManifest refuses, for `run`, slots that leave a class of the
// manifest's shards without one (--slots cpu=0, a class misspelt, or
// one left out): its own worker would never run them, and the run
// waited for good. Outlier classes count with their class
// (worker.SlotsOf).
func (s *slotsFlag) coverManifest(spec *stream.Spec, man *stream.Manifest) error {
	if s.auto {
		return nil
	}
	got := s.forClasses(spec.ClassNames())
	need := map[string]int{}
	for _, sh := range man.Shards {
		if n, _ := worker.SlotsOf(got, sh.Class); n == 0 {
			need[sh.Class]++
		}
	}
	if len(need) == 0 {
		return nil
	}
	classes := slices.Sorted(maps.Keys(need))
	var parts []string
	note := ""
	for _, c := range classes {
		parts = append(parts, fmt.Sprintf("%d shard(s) of class %s", need[c], c))
		if base, ok := strings.CutSuffix(c, plan.OutlierSuffix); ok {
			note += fmt.Sprintf(" (class %s holds the shards of class %s that cost far more than its median: docs/admission.md)", c, base)
		}
	}
	return exitErr{code: exitUsage, msg: fmt.Sprintf("run: --slots %s gives no slot to %s of %s%s: this run's worker would never run them; give the class slots (--slots %s=N), or --slots N or auto for every class",
		s, strings.Join(parts, " and "), man.Path, note, classes[0])}
}

func logger(stderr io.Writer, verbose bool, level slog.Level) *slog.Logger {
	if verbose {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
}

// parseSpec parses flags around exactly one SPEC argument and loads the
// spec and its manifest.
func parseSpec(fs *flag.FlagSet, args []string) (*stream.Spec, *stream.Manifest, error) {
	pos, err := parse(fs, args)
	if err != nil {
		return nil, nil, err
	}
	if len(pos) != 1 {
		return nil, nil, wrongCount(fs, pos, arguments(1))
	}
	return loadRun(pos[0])
}

// syncFlag is --sync group|always|none (with --no-sync as --sync none).
type syncFlag string

func (s *syncFlag) String() string { return string(*s) }

func (s *syncFlag) Set(v string) error {
	if !stream.ValidSync(v) {
		return fmt.Errorf("must be %s, %s or %s", stream.SyncGroup, stream.SyncAlways, stream.SyncNone)
	}
	*s = syncFlag(v)
	return nil
}

// registerSync adds --sync and --no-sync to fs.
func registerSync(fs *flag.FlagSet) *syncFlag {
	s := syncFlag(stream.SyncGroup)
	fs.Var(&s, "sync", "`MODE`: how the coordinator's store reaches the disk: group (every write a decision depends on is fsynced first, one syncfs shared by concurrent writers), always (fsync every write), none (a host crash can lose acknowledged state)")
	fs.BoolFunc("no-sync", "same as --sync none", func(string) error { s = stream.SyncNone; return nil })
	return &s
}

// carriedFlags spells the flags among names that the command line set,
// as they would be typed again (" --slots 2 --scratch /fast/x"), in the
// order of names: the commands a run writes down to resume or retry it
// must run it the way it ran (its scratch, where staged inputs are
// cached; its slots; its sync mode), not with the defaults. Path values
// must already be absolute, since those commands may be typed elsewhere.
// --no-sync is spelt as --sync none.
func carriedFlags(fs *flag.FlagSet, names ...string) string {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	set["sync"] = set["sync"] || set["no-sync"]
	var b strings.Builder
	for _, name := range names {
		if f := fs.Lookup(name); f != nil && set[name] {
			fmt.Fprintf(&b, " --%s %s", name, shellQuote(f.Value.String()))
		}
	}
	return b.String()
}

// flagSet reports whether the command line set the flag name.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
