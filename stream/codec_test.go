package stream

import (
	stdjson "encoding/json"
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
