package stream

import (
	stdjson "encoding/json"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"
)

// TestCodecMatchesEncodingJSON: records and messages go through a faster
// codec than encoding/json (see Encode), but the nats CLI, older workers
// and people read them, so the bytes must be the ones encoding/json
// writes, and what encoding/json wrote must decode the same. Every field
// of every schema type is filled, with text that needs escaping.
func TestCodecMatchesEncodingJSON(t *testing.T) {
	for _, v := range []any{&ShardMsg{}, &ShardRecord{}, &RunRecord{}, &Lease{}, &WorkerReport{}, &CommitRecord{}, &CoordinatorInfo{}} {
		fill(reflect.ValueOf(v).Elem(), 0)
		got, err := Encode(v)
		if err != nil {
			t.Fatalf("%T: %v", v, err)
		}
		want, err := stdjson.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("%T encodes differently:\n got %s\nwant %s", v, got, want)
		}
		back := reflect.New(reflect.TypeOf(v).Elem()).Interface()
		if err := Decode(want, back); err != nil {
			t.Fatalf("%T: %v", v, err)
		}
		std := reflect.New(reflect.TypeOf(v).Elem()).Interface()
		if err := stdjson.Unmarshal(want, std); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(back, std) {
			t.Errorf("%T decodes differently:\n got %+v\nwant %+v", v, back, std)
		}
	}
}

// fill sets every field reachable from v to a value that is not its zero,
// with strings that encoding/json escapes (HTML characters, U+2028, a
// control character, invalid UTF-8).
func fill(v reflect.Value, depth int) {
	switch v.Kind() {
	case reflect.String:
		v.SetString(fmt.Sprintf("a<b>&c\u2028d\x01e\xffé-%d", depth))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if v.Type() == reflect.TypeOf(Seconds(0)) {
			v.SetInt(int64(1234567 * time.Microsecond))
			return
		}
		v.SetInt(int64(-7 - depth))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(9 + depth))
	case reflect.Float32, reflect.Float64:
		v.SetFloat(0.000012345 + float64(depth))
	case reflect.Pointer:
		if depth > 4 {
			return
		}
		p := reflect.New(v.Type().Elem())
		fill(p.Elem(), depth+1)
		v.Set(p)
	case reflect.Slice:
		if depth > 4 {
			return
		}
		s := reflect.MakeSlice(v.Type(), 2, 2)
		for i := range 2 {
			fill(s.Index(i), depth+1)
		}
		v.Set(s)
	case reflect.Map:
		if depth > 4 {
			return
		}
		m := reflect.MakeMap(v.Type())
		for i := range 2 {
			k := reflect.New(v.Type().Key()).Elem()
			fill(k, depth+1+i)
			e := reflect.New(v.Type().Elem()).Elem()
			fill(e, depth+1)
			m.SetMapIndex(k, e)
		}
		v.Set(m)
	case reflect.Struct:
		if v.Type() == reflect.TypeOf(time.Time{}) {
			v.Set(reflect.ValueOf(time.Date(2026, 11, 30, 20, 44, 55, 123456789, time.UTC)))
			return
		}
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i), depth+1)
			}
		}
	}
}

// TestShardBriefReadsARecord: the tracker's ShardBrief reads from a full
// record what the record holds (a renamed field of either type fails
// here), counts its attempts, and refuses a schema version it does not
// know, as Decode does for the record.
func TestShardBriefReadsARecord(t *testing.T) {
	var r ShardRecord
	fill(reflect.ValueOf(&r).Elem(), 0)
	r.Attempts = append(r.Attempts, r.Attempts[0], r.Attempts[0])
	data, err := Encode(&r)
	if err != nil {
		t.Fatal(err)
	}
	// What the record reads back as (fill's text is not all valid UTF-8).
	r = ShardRecord{}
	if err := Decode(data, &r); err != nil {
		t.Fatal(err)
	}
	var b ShardBrief
	if err := Decode(data, &b); err != nil {
		t.Fatal(err)
	}
	if b.Fingerprint != r.Fingerprint || b.Class != r.Class || b.State != r.State || b.Retry != r.Retry || b.Reason != r.Reason ||
		len(b.Attempts) != len(r.Attempts) || b.Output == nil || *b.Output != *r.Output || b.V != SchemaVersion {
		t.Fatalf("brief %+v (output %+v), want the record's %+v", b, b.Output, r)
	}
	for _, f := range []string{"Fingerprint", "Class", "State", "Retry", "Reason", "Output"} {
		if r, _ := reflect.TypeOf(r).FieldByName(f); r.Tag == "" {
			t.Fatalf("ShardRecord.%s has no tag", f)
		} else if bf, _ := reflect.TypeOf(b).FieldByName(f); bf.Tag != r.Tag {
			t.Errorf("%s: brief's tag %q, record's %q", f, bf.Tag, r.Tag)
		}
	}
	var newer ShardBrief
	if err := Decode([]byte(`{"v":99,"state":"validated"}`), &newer); !errors.Is(err, ErrSchemaVersion) {
		t.Fatalf("a record of schema 99: %v, want ErrSchemaVersion", err)
	}
}
