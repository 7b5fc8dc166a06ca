# Multi-stage build: a static server and demo MCP server on a small,
# non-root runtime image.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o /out/server ./cmd/server \
 && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o /out/demo-mcp ./cmd/demo-mcp

FROM gcr.io/distroless/static-debian12:nonroot
WORKDIR /app
COPY --from=build /out/server /out/demo-mcp /app/bin/
COPY examples /app/examples
USER nonroot:nonroot
ENV PATCHBAY_ADDR=0.0.0.0:8080
EXPOSE 8080
ENTRYPOINT ["/app/bin/server"]
