package server

import "testing"

func TestJSONElements(t *testing.T) {
	for in, want := range map[string]int{
		`{}`:                           1,
		`{"a":[1,2,3]}`:                4,
		`{"s":"{[,\"{,"}`:              1, // inside a string, escaped quote included
		`{"s":"\\","t":{}}`:            3, // an escaped backslash ends before the quote
		`[{},{},{}]`:                   6,
		"{\"k\":\"\u00e9,\",\"m\":{}}": 3,
	} {
		if got := jsonElements([]byte(in)); got != want {
			t.Errorf("jsonElements(%s) = %d, want %d", in, got, want)
		}
	}
}
