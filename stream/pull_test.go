package stream_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/testenv"
)

// pullStream makes a work-queue stream of n messages ("m0".."m<n-1>") and
// its pull consumer, as SHARDS and a class's consumer are made.
func pullStream(t testing.TB, js jetstream.JetStream, name string, n int) jetstream.Consumer {
	t.Helper()
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Retention: jetstream.WorkQueuePolicy}); err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, name, jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if _, err := js.Publish(ctx, fmt.Sprintf("%s.x", name), fmt.Appendf(nil, "m%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	return cons
}

// drain reads a batch to its end.
func drain(t *testing.T, b *stream.Batch) []jetstream.Msg {
	t.Helper()
	var got []jetstream.Msg
	for {
		m, ok := b.Next()
		if !ok {
			return got
		}
		got = append(got, m)
	}
}

func datas(ms []jetstream.Msg) []string {
	var s []string
	for _, m := range ms {
		s = append(s, string(m.Data()))
	}
	sort.Strings(s)
	return s
}

// TestPullerDeliversAsTheLibraryDoes: a Puller's requests (pull.go, a
// faster path than nats.go's Fetch) get what was asked for and no more,
// end when the server says so (no messages, the request's expiry, the
// consumer deleted), keep their lane for the next request only then, and
// the messages they deliver answer Metadata and take acknowledgements as
// the library's do.
func TestPullerDeliversAsTheLibraryDoes(t *testing.T) {
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	ctx := context.Background()
	cons := pullStream(t, env.JS, "PULLT", 5)
	p := stream.NewPuller(env.JS, cons)
	defer p.Close()
	if !stream.PullsFast(p) {
		t.Fatal("the puller fetches through the library: nothing to compare")
	}

	// Three of five: exactly three, and the lane is free again at once.
	b, err := p.Fetch(3, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	got := drain(t, b)
	if d := datas(got); !slices.Equal(d, []string{"m0", "m1", "m2"}) || b.Error() != nil {
		t.Fatalf("fetch 3 of 5: got %v (%v), want m0..m2", d, b.Error())
	}
	if time.Since(start) > time.Second {
		t.Errorf("fetch 3 of 5 took %v: it waited past its last message", time.Since(start))
	}
	lanes := stream.IdleLanes(p)
	if len(lanes) != 1 {
		t.Fatalf("after a full batch: %d idle lanes, want 1", len(lanes))
	}

	// Metadata as the library reads it from the same reply subject.
	md, err := got[0].Metadata()
	if err != nil {
		t.Fatal(err)
	}
	if md.Stream != "PULLT" || md.Consumer != "c" || md.NumDelivered != 1 || md.Sequence.Stream != 1 || md.Sequence.Consumer != 1 || md.Timestamp.IsZero() {
		t.Errorf("metadata of m0: got %+v", md)
	}

	// Acknowledgements: once each (InProgress as often as wanted).
	if err := got[0].InProgress(); err != nil {
		t.Fatal(err)
	}
	if err := got[0].InProgress(); err != nil {
		t.Fatalf("a second InProgress: %v", err)
	}
	if err := got[0].Ack(); err != nil {
		t.Fatal(err)
	}
	if err := got[0].Ack(); !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
		t.Errorf("a second Ack: got %v, want ErrMsgAlreadyAckd", err)
	}
	if err := got[1].DoubleAck(ctx); err != nil {
		t.Fatalf("DoubleAck: %v", err)
	}
	if err := got[2].Nak(); err != nil {
		t.Fatal(err)
	}

	// Five asked, three left (m2 again, m3, m4): the request ends at its
	// expiry with the server's 408, not a second later, and its lane is
	// the same one.
	b, err = p.Fetch(5, 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	got = drain(t, b)
	waited := time.Since(start)
	if d := datas(got); !slices.Equal(d, []string{"m2", "m3", "m4"}) || b.Error() != nil {
		t.Fatalf("fetch 5 of 3: got %v (%v), want m2..m4", d, b.Error())
	}
	if waited < 250*time.Millisecond || waited > 1200*time.Millisecond {
		t.Errorf("fetch 5 of 3 ended after %v, want at its expiry (300ms)", waited)
	}
	if l := stream.IdleLanes(p); !slices.Equal(l, lanes) {
		t.Errorf("after an expired request: idle lanes %v, want the same one %v", l, lanes)
	}
	byData := map[string]jetstream.Msg{}
	for _, m := range got {
		byData[string(m.Data())] = m
	}
	if md, err := byData["m2"].Metadata(); err != nil || md.NumDelivered != 2 || md.Sequence.Stream != 3 {
		t.Errorf("m2 delivered again: got %+v (%v), want its second delivery of stream sequence 3", md, err)
	}

	// A Nak with a delay is not delivered before it; Term is never
	// delivered again; TermWithReason neither.
	if err := byData["m2"].NakWithDelay(time.Second); err != nil {
		t.Fatal(err)
	}
	if err := byData["m3"].Term(); err != nil {
		t.Fatal(err)
	}
	if err := byData["m4"].TermWithReason("bad input"); err != nil {
		t.Fatal(err)
	}
	if err := byData["m4"].Nak(); !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
		t.Errorf("Nak after Term: got %v, want ErrMsgAlreadyAckd", err)
	}
	b, _ = p.Fetch(1, 300*time.Millisecond)
	if got := drain(t, b); len(got) != 0 || b.Error() != nil {
		t.Fatalf("within the Nak's delay: got %v (%v), want nothing", datas(got), b.Error())
	}
	b, _ = p.Fetch(2, 2*time.Second)
	got = drain(t, b)
	if d := datas(got); !slices.Equal(d, []string{"m2"}) || b.Error() != nil {
		t.Fatalf("after the Nak's delay: got %v (%v), want m2 alone (m3 and m4 terminated)", d, b.Error())
	}
	if md, _ := got[0].Metadata(); md == nil || md.NumDelivered != 3 {
		t.Errorf("m2's third delivery: got %+v", md)
	}
	if err := got[0].DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	if info, err := cons.Info(ctx); err != nil || info.NumPending != 0 || info.NumAckPending != 0 {
		t.Fatalf("consumer after all acknowledged: %+v (%v), want nothing pending", info, err)
	}

	// Something on a lane between requests (it should never come): that
	// lane is not used again.
	if err := env.JS.Conn().Publish(lanes[0], []byte("stray")); err != nil {
		t.Fatal(err)
	}
	if err := env.JS.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // the client hands it to the lane
	if _, err := env.JS.Publish(ctx, "PULLT.x", []byte("m5")); err != nil {
		t.Fatal(err)
	}
	b, _ = p.Fetch(1, time.Second)
	got = drain(t, b)
	if d := datas(got); !slices.Equal(d, []string{"m5"}) {
		t.Fatalf("after a stray message on the idle lane: got %v (%v), want m5", d, b.Error())
	}
	if l := stream.IdleLanes(p); len(l) != 1 || l[0] == lanes[0] || stream.Lanes(p) != 1 {
		t.Errorf("after a stray message: idle lanes %v of %d, want one other than %s and no other", l, stream.Lanes(p), lanes[0])
	}
	if err := got[0].Ack(); err != nil {
		t.Fatal(err)
	}

	// The consumer deleted under a waiting request: the library's error.
	b, _ = p.Fetch(1, 5*time.Second)
	for i := 0; ; i++ { // the server told of the request first, or it drops it unanswered
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.NumWaiting == 1 {
			break
		}
		if i == 100 {
			t.Fatalf("the request never reached the consumer: %+v", info)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := env.JS.DeleteConsumer(ctx, "PULLT", "c"); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	if got := drain(t, b); len(got) != 0 || !errors.Is(b.Error(), jetstream.ErrConsumerDeleted) {
		t.Errorf("consumer deleted: got %v, error %v, want ErrConsumerDeleted", datas(got), b.Error())
	}
	if time.Since(start) > 2*time.Second {
		t.Errorf("consumer deleted: the request ended after %v, not when the server said so", time.Since(start))
	}
}

// TestPullerGivesUpALaneTheServerNeverAnswered: a request whose server
// never says it is over (here: nothing serves the consumer's subject)
// ends a second past its expiry, and its lane is not used again.
func TestPullerGivesUpALaneTheServerNeverAnswered(t *testing.T) {
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	cons := pullStream(t, env.JS, "PULLU", 0)
	p := stream.NewPullerFor(env.JS, cons, "PULLU", "nobody") // no such consumer: no answer
	defer p.Close()
	// This subscription stands in for the consumer, and never answers.
	sub, err := env.JS.Conn().SubscribeSync("$JS.API.CONSUMER.MSG.NEXT.PULLU.nobody")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	b, err := p.Fetch(1, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	req, err := sub.NextMsg(time.Second)
	if err != nil {
		t.Fatalf("the pull request was not sent: %v", err)
	}
	if want := `{"expires":100000000,"batch":1}`; string(req.Data) != want {
		t.Errorf("pull request: got %s, want %s", req.Data, want)
	}
	start := time.Now()
	if got := drain(t, b); len(got) != 0 || b.Error() != nil {
		t.Errorf("unanswered request: got %v (%v), want nothing", datas(got), b.Error())
	}
	if d := time.Since(start); d < 900*time.Millisecond || d > 3*time.Second {
		t.Errorf("unanswered request ended after %v, want its expiry and a second", d)
	}
	if l := stream.IdleLanes(p); len(l) != 0 || stream.Lanes(p) != 0 {
		t.Errorf("after an unanswered request: idle lanes %v of %d, want none", l, stream.Lanes(p))
	}
}

// TestPullerClosedDropsLanesAsTheyComeBack: a request still open when its
// Puller closes ends as it would, and its lane is then dropped, not kept
// idle for requests that will not come.
func TestPullerClosedDropsLanesAsTheyComeBack(t *testing.T) {
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	cons := pullStream(t, env.JS, "PULLC", 0)
	p := stream.NewPuller(env.JS, cons)
	idle, _ := p.Fetch(1, 100*time.Millisecond)
	if got := drain(t, idle); len(got) != 0 || idle.Error() != nil || len(stream.IdleLanes(p)) != 1 {
		t.Fatalf("empty queue: got %v (%v), idle lanes %v, want nothing and one idle lane", datas(got), idle.Error(), stream.IdleLanes(p))
	}
	b, err := p.Fetch(1, 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	if n := stream.Lanes(p); n != 1 {
		t.Fatalf("closed with a request open: %d lanes, want that request's alone", n)
	}
	if got := drain(t, b); len(got) != 0 || b.Error() != nil {
		t.Errorf("request open at Close: got %v (%v), want its usual end", datas(got), b.Error())
	}
	if n, l := stream.Lanes(p), stream.IdleLanes(p); n != 0 || len(l) != 0 {
		t.Errorf("after the last request of a closed puller: %d lanes, idle %v, want none", n, l)
	}
}

// TestPullerWithADomainUsesTheLibrary: the subject a Puller builds has no
// JetStream domain in it; with one it fetches through nats.go.
func TestPullerWithADomainUsesTheLibrary(t *testing.T) {
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	js, err := jetstream.NewWithDomain(env.JS.Conn(), "elsewhere")
	if err != nil {
		t.Fatal(err)
	}
	cons := pullStream(t, env.JS, "PULLD", 0)
	if p := stream.NewPuller(js, cons); stream.PullsFast(p) {
		t.Error("a JetStream with a domain: the puller builds its own subject")
	}
}

// BenchmarkFetchOne is a worker's fetch of one shard and its DoubleAck,
// through nats.go's Fetch and through a Puller, on the in-process
// connection a `shardpool run` uses.
func BenchmarkFetchOne(b *testing.B) {
	env := testenv.New(b, testenv.Options{NoWorkers: true})
	ctx := context.Background()
	for _, c := range []struct {
		name  string
		fetch func(cons jetstream.Consumer, p *stream.Puller) (jetstream.Msg, error)
	}{
		{"library", func(cons jetstream.Consumer, _ *stream.Puller) (jetstream.Msg, error) {
			batch, err := cons.Fetch(1, jetstream.FetchMaxWait(time.Second))
			if err != nil {
				return nil, err
			}
			var got jetstream.Msg
			for m := range batch.Messages() {
				got = m
			}
			return got, batch.Error()
		}},
		{"puller", func(_ jetstream.Consumer, p *stream.Puller) (jetstream.Msg, error) {
			batch, err := p.Fetch(1, time.Second)
			if err != nil {
				return nil, err
			}
			var got jetstream.Msg
			for m, ok := batch.Next(); ok; m, ok = batch.Next() {
				got = m
			}
			return got, batch.Error()
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			name := "BENCH" + strings.ToUpper(c.name)
			cons := pullStream(b, env.JS, name, 0)
			p := stream.NewPuller(env.JS, cons)
			defer p.Close()
			b.StopTimer()
			for i := range b.N {
				if _, err := env.JS.PublishAsync(name+".x", fmt.Appendf(nil, "m%d", i)); err != nil {
					b.Fatal(err)
				}
			}
			<-env.JS.PublishAsyncComplete()
			b.ReportAllocs()
			b.StartTimer()
			for range b.N {
				m, err := c.fetch(cons, p)
				if m == nil {
					b.Fatalf("no message (%v)", err)
				}
				if err := m.DoubleAck(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
