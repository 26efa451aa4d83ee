//go:build tools

// Package critools records the packages critest's test main imports, so that
// go.sum covers `go test -c sigs.k8s.io/cri-tools/cmd/critest`.
package critools

import (
	_ "github.com/onsi/ginkgo/v2"
	_ "github.com/onsi/gomega"
	_ "sigs.k8s.io/cri-tools/pkg/benchmark"
	_ "sigs.k8s.io/cri-tools/pkg/framework"
	_ "sigs.k8s.io/cri-tools/pkg/validate"
)
