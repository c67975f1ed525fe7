package admission

import (
	"crypto/sha256"
	"errors"
	"testing"
)

func testKeys(t testing.TB) *Keys {
	t.Helper()
	ks, err := NewKeys([]KeyConfig{
		{Name: "team-a", Hash: sha256.Sum256([]byte("sk-team-a")), Class: Standard, Models: []string{"m2", "m1"}},
		{Name: "svc", Hash: sha256.Sum256([]byte("sk-svc")), Class: Critical},
	})
	if err != nil {
		t.Fatal(err)
	}
	return ks
}

func TestAuthenticate(t *testing.T) {
	ks := testKeys(t)
	for _, tc := range []struct {
		name   string
		header string
		absent bool
		want   string // key name
		err    error
	}{
		{name: "valid", header: "Bearer sk-team-a", want: "team-a"},
		{name: "scheme in any case", header: "bearer sk-svc", want: "svc"},
		{name: "extra spaces", header: "  BEARER   sk-svc  ", want: "svc"},
		{name: "tab separator", header: "Bearer\tsk-svc", want: "svc"},
		{name: "absent", absent: true, err: ErrMissingKey},
		{name: "empty", header: "", err: ErrMissingKey},
		{name: "scheme only", header: "Bearer", err: ErrMissingKey},
		{name: "scheme and spaces", header: "Bearer   ", err: ErrMissingKey},
		{name: "basic auth", header: "Basic dXNlcjpwYXNz", err: ErrMissingKey},
		{name: "no separator", header: "Bearersk-svc", err: ErrMissingKey},
		{name: "two tokens", header: "Bearer sk-svc extra", err: ErrMissingKey},
		{name: "unknown key", header: "Bearer sk-nope", err: ErrInvalidKey},
		{name: "case matters in the key", header: "Bearer SK-SVC", err: ErrInvalidKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h []byte
			if !tc.absent {
				h = []byte(tc.header)
			}
			k, err := ks.Authenticate(h)
			if !errors.Is(err, tc.err) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			if tc.err != nil {
				var ae *Error
				if !errors.As(err, &ae) || ae.Status != 401 || ae.Code != "invalid_api_key" || !ae.NoRetry {
					t.Errorf("refusal %+v is not a final 401 invalid_api_key", ae)
				}
				return
			}
			if k == nil || k.Name != tc.want {
				t.Errorf("key = %v, want %s", k, tc.want)
			}
		})
	}
}

func TestNoKeysLetsEveryoneIn(t *testing.T) {
	ks, err := NewKeys(nil)
	if err != nil || ks != nil {
		t.Fatalf("NewKeys(nil) = %v, %v; want nil, nil", ks, err)
	}
	k, err := ks.Authenticate(nil)
	if k != nil || err != nil {
		t.Errorf("Authenticate on no keys = %v, %v", k, err)
	}
	if err := Authorize(nil, "anything"); err != nil {
		t.Errorf("Authorize(nil key) = %v", err)
	}
}

func TestAuthorize(t *testing.T) {
	ks := testKeys(t)
	a, _ := ks.Authenticate([]byte("Bearer sk-team-a"))
	svc, _ := ks.Authenticate([]byte("Bearer sk-svc"))
	for _, tc := range []struct {
		key   *Key
		model string
		err   error
	}{
		{a, "m1", nil},
		{a, "m2", nil},
		{a, "m3", ErrModelNotAllowed},
		{a, "", ErrModelNotAllowed},
		{svc, "m3", nil},
	} {
		err := Authorize(tc.key, tc.model)
		if !errors.Is(err, tc.err) {
			t.Errorf("Authorize(%s, %q) = %v, want %v", tc.key.Name, tc.model, err, tc.err)
		}
	}
	if ErrModelNotAllowed.Status != 403 || ErrModelNotAllowed.Code != "model_not_allowed" || !ErrModelNotAllowed.NoRetry {
		t.Errorf("ErrModelNotAllowed = %+v", ErrModelNotAllowed)
	}
}

func TestNewKeysRejects(t *testing.T) {
	h := sha256.Sum256([]byte("k"))
	for _, tc := range []struct {
		name string
		cfgs []KeyConfig
	}{
		{"empty name", []KeyConfig{{Hash: h}}},
		{"duplicate name", []KeyConfig{{Name: "a", Hash: h}, {Name: "a", Hash: sha256.Sum256([]byte("j"))}}},
		{"duplicate key", []KeyConfig{{Name: "a", Hash: h}, {Name: "b", Hash: h}}},
		{"negative limit", []KeyConfig{{Name: "a", Hash: h, RequestsPerMinute: -1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := NewKeys(tc.cfgs); err == nil {
				t.Error("NewKeys accepted it")
			}
		})
	}
}

func TestAuthenticateDoesNotAllocate(t *testing.T) {
	ks := testKeys(t)
	h := []byte("Bearer sk-team-a")
	bad := []byte("Bearer sk-wrong")
	allocs := testing.AllocsPerRun(100, func() {
		_, _ = ks.Authenticate(h)
		_, _ = ks.Authenticate(bad)
	})
	if allocs != 0 {
		t.Errorf("Authenticate allocates %v times per call pair", allocs)
	}
}
