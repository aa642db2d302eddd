package thread

import (
	"math"
	"testing"
	"time"
)

func TestTodoCursor(t *testing.T) {
	at := time.Date(2026, 11, 30, 3, 4, 5, 123456000, time.UTC)
	c := todoCursor{at, 2, 42}
	back, err := parseTodoCursor(c.String())
	if err != nil || back != c {
		t.Fatalf("round trip: %v %v", back, err)
	}
	after, b1, b2, b3, b4 := c.bounds()
	if !after.Equal(at) || b1 != math.MaxInt64 || b2 != 42 || b3 != 0 || b4 != 0 {
		t.Fatalf("bounds: %v %d %d %d %d", after, b1, b2, b3, b4)
	}
	if after, _, _, _, _ := (todoCursor{}).bounds(); !after.IsZero() {
		t.Fatal("first page has a time bound")
	}
	for _, bad := range []string{"x", "a|b|c", at.Format(time.RFC3339Nano) + "|5|1", at.Format(time.RFC3339Nano) + "|1|0", "2026-11-30 03:04:05|1|1"} {
		if _, err := parseTodoCursor(bad); err == nil {
			t.Errorf("parseTodoCursor(%q) accepted", bad)
		}
	}
}

func TestResponders(t *testing.T) {
	gov := member{1, "gov", "governor"}
	a := member{2, "a", "speaker"}
	b := member{3, "b", "speaker"}
	obs := member{4, "obs", "observer"}
	names := func(ms []member) (out []string) {
		for _, m := range ms {
			out = append(out, m.name)
		}
		return
	}
	cases := []struct {
		name        string
		in          PostInput
		members     []member
		replyAuthor int64
		want        []string
	}{
		{"explicit ask", PostInput{Ask: []string{"a", "B", "3"}}, []member{gov, a, b}, 0, []string{"a", "b"}},
		{"empty ask is nobody", PostInput{Ask: []string{}}, []member{gov, a}, 0, nil},
		{"reply asks the author", PostInput{ReplyTo: 9}, []member{gov, a, b}, 2, []string{"a"}},
		{"reply to an observer asks nobody", PostInput{ReplyTo: 9}, []member{gov, a, b, obs}, 4, nil},
		{"reply to a departed author asks nobody", PostInput{ReplyTo: 9}, []member{gov, a, b}, 77, nil},
		{"two speakers: the other one", PostInput{}, []member{gov, a, obs}, 0, []string{"a"}},
		{"three speakers: nobody", PostInput{}, []member{gov, a, b}, 0, nil},
	}
	for _, c := range cases {
		got, err := responders(1, c.in, c.members, c.replyAuthor)
		if err != nil || len(names(got)) != len(c.want) {
			t.Errorf("%s: %v %v, want %v", c.name, names(got), err, c.want)
			continue
		}
		for i := range c.want {
			if names(got)[i] != c.want[i] {
				t.Errorf("%s: %v, want %v", c.name, names(got), c.want)
			}
		}
	}
	for _, bad := range [][]string{{"gov"}, {"obs"}, {"stranger"}} {
		if _, err := responders(1, PostInput{Ask: bad}, []member{gov, a, obs}, 0); err == nil {
			t.Errorf("ask %v accepted", bad)
		}
	}
}
