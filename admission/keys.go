package admission

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
)

// KeyConfig is one API key as the policy declares it.
type KeyConfig struct {
	// Name identifies the key in logs and metrics (never the key itself). Required, unique.
	Name string
	// Hash is the SHA-256 of the key's text. Required, unique.
	Hash [sha256.Size]byte
	// Class is the class of the key's requests and the most the priority header can claim for them (see
	// Priorities). The policy fills priorities.default for a key that names none.
	Class Class
	// Models are the public model names the key may use; empty means all.
	Models []string
	// RequestsPerMinute and TokensPerMinute are the key's rate limits; 0 means unlimited.
	RequestsPerMinute int64
	TokensPerMinute   int64
	// CacheOptIn lets the key's requests opt in to the response cache with "X-Switchyard-Cache: on"
	// (proxy.ResponseCache); without it the header's "on" is ignored. Default false.
	CacheOptIn bool
	// Budget is the key's money budget per period (Spender); the zero Budget is none.
	Budget Budget
	// Objective is what routing optimises for the key's requests when they name none: "latency",
	// "throughput" or "cost" (the proxy resolves the name); "" leaves it to the model.
	Objective string
}

// Key is an authenticated API key: what the request path learns from Authenticate. It is immutable and safe
// to share; a policy reload builds new Keys.
type Key struct {
	// Name is the key's name from the policy.
	Name string
	// Class is the key's class (see Priorities.Class).
	Class Class
	// RequestsPerMinute and TokensPerMinute are the key's limits; 0 means unlimited.
	RequestsPerMinute int64
	TokensPerMinute   int64
	// CacheOptIn is KeyConfig.CacheOptIn.
	CacheOptIn bool
	// Budget is KeyConfig.Budget.
	Budget Budget
	// Objective is KeyConfig.Objective.
	Objective string

	models []string // sorted; nil means all
	hash   [sha256.Size]byte
}

// Hash returns the SHA-256 of the key's text: what tells two keys apart whatever their names, e.g. the response
// cache's partition (proxy.ResponseCache). It is not a secret the way the key is (the policy file may hold it),
// but it names a credential: keep it out of logs and metrics, where the key's Name belongs.
func (k *Key) Hash() [sha256.Size]byte { return k.hash }

// Allows reports whether the key may use the public model named model. It does not allocate.
func (k *Key) Allows(model string) bool {
	if k.models == nil {
		return true
	}
	_, ok := slices.BinarySearch(k.models, model)
	return ok
}

// Keys is the set of API keys a gateway accepts, looked up by the SHA-256 of the presented key. A nil *Keys
// means "no keys configured": Authenticate lets every request through with a nil Key. Immutable once built;
// safe for concurrent use.
type Keys struct {
	byHash map[[sha256.Size]byte]*Key
	list   []*Key
}

// NewKeys builds the key set. It fails on an empty or duplicate name and on a duplicate hash (the policy
// validates both already; this is the backstop). An empty cfgs returns nil: no authentication.
func NewKeys(cfgs []KeyConfig) (*Keys, error) {
	if len(cfgs) == 0 {
		return nil, nil
	}
	ks := &Keys{byHash: make(map[[sha256.Size]byte]*Key, len(cfgs))}
	names := make(map[string]bool, len(cfgs))
	var errs []error
	for i, c := range cfgs {
		switch {
		case c.Name == "":
			errs = append(errs, fmt.Errorf("api_keys[%d]: empty name", i))
			continue
		case names[c.Name]:
			errs = append(errs, fmt.Errorf("api_keys[%d]: duplicate name %q", i, c.Name))
			continue
		case ks.byHash[c.Hash] != nil:
			errs = append(errs, fmt.Errorf("api_keys[%d] (%s): same key as %s", i, c.Name, ks.byHash[c.Hash].Name))
			continue
		case c.RequestsPerMinute < 0 || c.TokensPerMinute < 0:
			errs = append(errs, fmt.Errorf("api_keys[%d] (%s): negative limit", i, c.Name))
			continue
		}
		names[c.Name] = true
		k := &Key{Name: c.Name, Class: c.Class, RequestsPerMinute: c.RequestsPerMinute, TokensPerMinute: c.TokensPerMinute,
			CacheOptIn: c.CacheOptIn, Budget: c.Budget, Objective: c.Objective, hash: c.Hash}
		if len(c.Models) > 0 {
			k.models = slices.Clone(c.Models)
			slices.Sort(k.models)
			k.models = slices.Compact(k.models)
		}
		ks.byHash[c.Hash] = k
		ks.list = append(ks.list, k)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return ks, nil
}

// All returns the keys in declaration order. The slice is shared: do not modify it.
func (ks *Keys) All() []*Key {
	if ks == nil {
		return nil
	}
	return ks.list
}

const bearer = "bearer"

// Authenticate checks the value of a request's Authorization header (nil when absent). On a nil *Keys it
// returns (nil, nil): no keys are configured and every request passes. Otherwise it accepts only
// "Bearer <key>" (the scheme in any case, RFC 9110 section 11.1) whose SHA-256 is a configured key's hash, and
// returns that key; the error is ErrMissingKey when there is no bearer key and ErrInvalidKey when it is unknown
// (both 401 invalid_api_key with x-should-retry: false).
//
// Call it once per request, before anything else of admission. It does not allocate and does not retain
// authorization. The presented key is hashed and the hash looked up in a map: the map compares hashes, not keys,
// so its timing reveals nothing about a valid key (finding a key from its hash is a SHA-256 preimage), and the
// plaintext of valid keys is never in memory.
func (ks *Keys) Authenticate(authorization []byte) (*Key, error) {
	if ks == nil {
		return nil, nil
	}
	a := trimSpace(authorization)
	if len(a) <= len(bearer) || !equalFold(a[:len(bearer)], bearer) || (a[len(bearer)] != ' ' && a[len(bearer)] != '\t') {
		return nil, ErrMissingKey
	}
	token := trimSpace(a[len(bearer):])
	if len(token) == 0 || bytes.ContainsAny(token, " \t") {
		return nil, ErrMissingKey
	}
	k := ks.byHash[sha256.Sum256(token)]
	if k == nil {
		return nil, ErrInvalidKey
	}
	return k, nil
}

// Authorize checks that key may use model: nil when it may (or when key is nil: no keys configured),
// ErrModelNotAllowed (403, x-should-retry: false) otherwise. Call it once the model is known.
func Authorize(key *Key, model string) error {
	if key == nil || key.Allows(model) {
		return nil
	}
	return ErrModelNotAllowed
}
