package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"github.com/shardpool/shardpool/coordinator/drill"
	"github.com/shardpool/shardpool/worker"
)

func cmdDrill(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("drill", "shardpool drill [--data DIR] [--json]", stderr)
	data := fs.String("data", worker.DefaultStateDir(), "state `DIR`; the drill works in DIR/drill/<time>/")
	asJSON := fs.Bool("json", false, "print drill.json instead of the table")
	if err := parseNone(fs, args); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("drill: find own binary: %w", err)
	}
	progress := stderr
	rep, err := drill.Run(ctx, drill.Config{Binary: self, DataDir: *data, Progress: progress})
	if err != nil {
		return err
	}
	if *asJSON {
		if err := writeJSON(stdout, rep); err != nil {
			return err
		}
	} else {
		tw := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "CHECK\tRESULT\tDETAIL")
		for _, c := range rep.Checks {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", c.Name, c.Status, c.Detail)
		}
		tw.Flush()
		fmt.Fprintf(stdout, "\n%.1fs; drill.json: %s\n", rep.Seconds, rep.Evidence)
	}
	if !rep.Passed {
		return exitErr{code: exitFailure, msg: "drill failed: see the checks above"}
	}
	return nil
}
