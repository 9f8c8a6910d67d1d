# syntax=docker/dockerfile:1
#
# billing-consumer: a static Go binary on distroless, as the non-root user.
#
#   docker build --build-arg VERSION=$(git describe --tags --always) \
#     --build-arg COMMIT=$(git rev-parse --short HEAD) -t billing-consumer .
#
# The same flags as `make build`. deploy/dockerfile_test.go checks the
# invariants below (distroless, non-root, CGO_ENABLED=0, -trimpath, the
# version stamp) and that its -ldflags stamp a working `version` command.
# Pin both base images by digest (@sha256:...) in a release pipeline.

FROM --platform=$BUILDPLATFORM golang:1.26-bookworm AS build
WORKDIR /src
# A static binary: no libc to match at run time, runs on distroless/static.
ENV CGO_ENABLED=0
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY cmd/ cmd/
COPY db/ db/
COPY internal/ internal/
ARG TARGETOS TARGETARCH
ARG VERSION=dev
ARG COMMIT=unknown
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -buildvcs=false \
      -ldflags "-s -w -X main.version=${VERSION} -X main.commit=${COMMIT}" \
      -o /out/billing-consumer ./cmd/billing-consumer

# No shell, no package manager; CA certificates (https payment provider) and
# tzdata included. The :nonroot tag runs as 65532, as deploy/ expects.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/billing-consumer /billing-consumer
ARG VERSION=dev
ARG COMMIT=unknown
LABEL org.opencontainers.image.title=billing-consumer \
      org.opencontainers.image.version=$VERSION \
      org.opencontainers.image.revision=$COMMIT \
      org.opencontainers.image.source=https://github.com/billing-consumer/billing-consumer
USER 65532:65532
# /metrics, /healthz, /readyz (BILLING_HTTP_ADDR)
EXPOSE 9090
ENTRYPOINT ["/billing-consumer"]
CMD ["run"]
