package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// connWatch watches a worker's connection to its coordinator and says
// what happens to it, once per change: lost, back, refused.
//
// A worker rides out coordinator restarts, but the one that answers after
// a restart may refuse its token (a coordinator started anew with another
// --data, or its token file replaced) or fail its pinned certificate
// authority. nats.go then closed the connection on the second refusal,
// and the worker went on for ever with a connection that could never come
// back, logging "connection closed" twice a second. Now a refused
// connection keeps trying, reading the token file again at every try (and
// the authority at every handshake: ClientTLS), so the new coordinator's
// files copied over them take the worker back; the worker says once what
// happened and what to do, and stops with exit 1 when it is still refused
// after --connect-wait.
type connWatch struct {
	url    string
	acc    access
	stderr io.Writer

	// nc is the connection, once made: a certificate the coordinator's
	// new authority signed fails the handshake of each reconnect, which
	// nats.go reports to no handler, only as the connection's last error.
	nc *nats.Conn

	mu     sync.Mutex
	lost   time.Time // when the connection was lost; zero while connected
	back   time.Time // when it last came back
	since  time.Time // when the refusals began; zero while none
	err    error     // the last refusal
	closed error     // why the connection closed, where it did
	poke   chan struct{}
}

func newConnWatch(url string, acc access, stderr io.Writer) *connWatch {
	return &connWatch{url: redactURL(url), acc: acc, stderr: stderr, poke: make(chan struct{}, 1)}
}

// options are the connection's options for it: refusals do not close the
// connection, and every error and change of state is seen here.
func (c *connWatch) options() []nats.Option {
	return []nats.Option{
		nats.IgnoreAuthErrorAbort(),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if c.note(err) {
				return
			}
			// A pull consumer's missed heartbeats while the connection is
			// down, or just back: the loss is told once, not per class.
			if errors.Is(err, nats.ErrConsumerNotActive) {
				if c.lostLately() {
					return
				}
			}
			fmt.Fprintf(c.stderr, "nats: %s\n", strings.TrimPrefix(err.Error(), "nats: ")) // as nats.go's own handler
		}),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if nc.IsClosed() {
				// The worker's own close at its end (or a close the
				// ClosedHandler tells), not a coordinator lost.
				return
			}
			c.mu.Lock()
			first := c.lost.IsZero()
			if first {
				c.lost = time.Now()
			}
			c.mu.Unlock()
			if first {
				why := ""
				if err != nil {
					why = " (" + strings.TrimPrefix(err.Error(), "nats: ") + ")"
				}
				fmt.Fprintf(c.stderr, "lost the coordinator at %s%s: trying again twice a second, for as long as it takes; running shards go on, and their records wait for it\n", c.url, why)
			}
		}),
		nats.ReconnectErrHandler(func(_ *nats.Conn, err error) { c.note(err) }),
		nats.ReconnectHandler(func(*nats.Conn) {
			c.mu.Lock()
			lost, refused := c.lost, !c.since.IsZero()
			c.lost, c.since, c.err, c.back = time.Time{}, time.Time{}, nil, time.Now()
			c.mu.Unlock()
			switch {
			case refused:
				fmt.Fprintf(c.stderr, "the coordinator at %s takes this worker again\n", c.url)
			case !lost.IsZero():
				fmt.Fprintf(c.stderr, "the coordinator at %s answers again, after %s\n", c.url, time.Since(lost).Round(time.Second))
			}
		}),
		nats.ClosedHandler(func(nc *nats.Conn) {
			c.mu.Lock()
			c.closed = fmt.Errorf("its connection to the coordinator at %s closed (%v)", c.url, nc.LastError())
			c.mu.Unlock()
			c.wake()
		}),
	}
}

// lostLately says whether the connection is down or came back within the
// last 30 s.
func (c *connWatch) lostLately() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.lost.IsZero() || time.Since(c.back) < 30*time.Second
}

// note records err where it is a refusal of this client's token or of the
// coordinator's certificate, and says whether it was one.
func (c *connWatch) note(err error) bool {
	if err == nil || !(isAuthError(err) || isCertError(err) || isCertTimeError(err)) {
		return false
	}
	c.mu.Lock()
	if c.since.IsZero() {
		c.since = time.Now()
	}
	c.err = err
	c.mu.Unlock()
	c.wake()
	return true
}

func (c *connWatch) wake() {
	select {
	case c.poke <- struct{}{}:
	default:
	}
}

// why is what the refusal err means and how to end it.
func (c *connWatch) why(err error) string {
	if isCertTimeError(err) {
		return fmt.Sprintf("this worker cannot take the coordinator at %s now (%v)", c.url, err)
	}
	if isCertError(err) {
		return fmt.Sprintf("the coordinator at %s is not the one whose certificate authority is %s (%v): another coordinator, or its store made anew; copy its ca.pem and token (DATA/jetstream/ of its --data) over %s and %s, which are read again at every try",
			c.url, absPath(c.acc.ca), err, absPath(c.acc.ca), absPath(c.acc.token))
	}
	// nats.go's own error or the server's words, as they came first.
	said := strings.ToLower(strings.TrimPrefix(err.Error(), "nats: "))
	if c.acc.token == "" {
		return fmt.Sprintf("the coordinator at %s refuses this worker now (%s): it asks for a token; pass --token-file FILE, DATA/jetstream/token of its --data", c.url, said)
	}
	return fmt.Sprintf("the coordinator at %s refuses this worker now (%s): its token is no longer the one in %s (a coordinator started anew with another --data, or its token replaced); copy DATA/jetstream/token of its --data there, which is read again at every try",
		c.url, said, absPath(c.acc.token))
}

// watch says once that the coordinator refuses the connection, and calls
// stop with the reason once it has for wait, or once the connection has
// closed. It returns when ctx ends.
func (c *connWatch) watch(ctx context.Context, wait time.Duration, stop func(error)) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	told := false
	for {
		if c.nc != nil && c.nc.IsReconnecting() {
			c.note(c.nc.LastError())
		}
		c.mu.Lock()
		since, err, closed := c.since, c.err, c.closed
		c.mu.Unlock()
		switch {
		case closed != nil:
			stop(closed)
			return
		case since.IsZero():
			told = false
		case time.Since(since) >= wait:
			stop(fmt.Errorf("%s; refused for %s (--connect-wait), so it stops", c.why(err), time.Since(since).Round(time.Second)))
			return
		case !told:
			fmt.Fprintf(c.stderr, "%s; it stops if still refused after %s (--connect-wait); its running shards go on meanwhile\n", c.why(err), wait)
			told = true
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-c.poke:
		}
	}
}
