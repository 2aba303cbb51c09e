# syntax=docker/dockerfile:1
# nodeguard's image: a static binary on distroless (no shell, no package
# manager), running as the nonroot user 65532. Build with `make image`.

FROM --platform=$BUILDPLATFORM golang:1.26 AS build
ARG TARGETOS=linux
ARG TARGETARCH=amd64
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
# .dockerignore leaves out tests, manifests, charts and bin/.
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags="-s -w" -o /out/nodeguard ./cmd/nodeguard

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/nodeguard /nodeguard
USER 65532:65532
ENTRYPOINT ["/nodeguard"]
