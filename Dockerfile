# syntax=docker/dockerfile:1
# Multi-stage build: a static switchyard binary in a distroless image that runs as a non-root user.
#
#     docker build -t switchyard \
#       --build-arg VERSION=$(git describe --tags --always --dirty) \
#       --build-arg COMMIT=$(git rev-parse HEAD) \
#       --build-arg COMMIT_TIME=$(git log -1 --format=%cI) .
#
# The build arguments are what `switchyard version` prints; the build context need not hold a .git directory
# (a worktree's .git is a file pointing outside it), so the commit is given, not read. Without them the image
# says "(devel)".
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=""
ARG COMMIT=""
ARG COMMIT_TIME=""
RUN CGO_ENABLED=0 go build -trimpath -buildvcs=false \
      -ldflags="-s -w -X main.version=${VERSION} -X main.commit=${COMMIT} -X main.commitTime=${COMMIT_TIME}" \
      -o /out/switchyard ./cmd/switchyard

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/switchyard /usr/local/bin/switchyard
# The container policy (deploy/container/config.yaml): listens on 0.0.0.0, takes its API key from
# SWITCHYARD_API_KEY (it refuses to start without one) and its backend from SWITCHYARD_BACKEND_URL. Mount a
# policy of your own over it for anything more.
COPY deploy/container/config.yaml /etc/switchyard/config.yaml
USER 65532:65532
# 8080: client API (OpenAI-compatible); 9090: admin (/metrics, /healthz, /readyz, /debug/backends)
EXPOSE 8080 9090
ENTRYPOINT ["switchyard"]
CMD ["serve", "-config", "/etc/switchyard/config.yaml"]
