//go:build deps

package switchyard

// The chosen dependencies, pinned in go.mod before the code that uses them lands, so that parallel work never
// races on go.mod. Remove an import here once a package imports it for real.
import (
	_ "github.com/cespare/xxhash/v2"
	_ "github.com/fsnotify/fsnotify"
	_ "github.com/openai/openai-go/v3"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/sony/gobreaker/v2"
	_ "github.com/valyala/fasthttp"
	_ "gopkg.in/yaml.v3"
)
