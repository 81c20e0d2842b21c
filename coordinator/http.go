package coordinator

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
)

func (c *Coordinator) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /status", c.serveStatus)
	mux.HandleFunc("GET /status/{run}", c.serveStatus)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if hs := c.srv.Healthz(nil); hs == nil || hs.Status != "ok" {
			http.Error(w, "jetstream not healthy", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok\n"))
	})
	return mux
}

func (c *Coordinator) serveStatus(w http.ResponseWriter, r *http.Request) {
	run := strings.TrimSpace(r.PathValue("run"))
	st, err := ReadStatus(r.Context(), c.js, run)
	if errors.Is(err, ErrRunNotFound) {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(st)
}
