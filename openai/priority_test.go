package openai

import (
	"encoding/json"
	"testing"
)

func TestAppendPriority(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		priority   int
		want       string
	}{
		{"inserted", `{"model":"m","messages":[]}`, -1, `{"priority":-1,"model":"m","messages":[]}`},
		{"replaced", `{"model":"m", "priority" : 7 ,"n":1}`, 1, `{"model":"m", "priority" : 1 ,"n":1}`},
		{"replaced null", `{"priority":null}`, 0, `{"priority":0}`},
		{"nested left alone", `{"metadata":{"priority":9},"model":"m"}`, -1,
			`{"priority":-1,"metadata":{"priority":9},"model":"m"}`},
		{"escaped key", `{"pr\u0069ority":3}`, 1, `{"pr\u0069ority":1}`},
		{"empty object", ` {}`, 2, ` {"priority":2}`},
		{"not an object", `[1]`, 1, `[1]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := string(AppendPriority([]byte("x"), []byte(tc.body), tc.priority))
			if got != "x"+tc.want {
				t.Fatalf("AppendPriority(%s) = %s, want %s", tc.body, got[1:], tc.want)
			}
			if tc.body[len(tc.body)-1] == '}' {
				var v map[string]any
				if err := json.Unmarshal([]byte(tc.want), &v); err != nil || v["priority"] != float64(tc.priority) {
					t.Errorf("%s decodes to %v (%v)", tc.want, v, err)
				}
			}
		})
	}
}

func TestAppendPriorityDoesNotAllocate(t *testing.T) {
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`)
	dst := make([]byte, 0, 256)
	if n := testing.AllocsPerRun(100, func() { dst = AppendPriority(dst[:0], body, -1) }); n != 0 {
		t.Errorf("%v allocations, want 0", n)
	}
}
