package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// webhookConfigurations reads the webhook configurations in paths (files, or
// directories of .yaml files, as envtest reads them), leaving out the
// webhooks named in without.
func webhookConfigurations(paths, without []string) ([]*admissionregistrationv1.MutatingWebhookConfiguration, []*admissionregistrationv1.ValidatingWebhookConfiguration, error) {
	var mutating []*admissionregistrationv1.MutatingWebhookConfiguration
	var validating []*admissionregistrationv1.ValidatingWebhookConfiguration
	left := func(name string) bool { return !slices.Contains(without, name) }
	files, err := yamlFiles(paths)
	if err != nil {
		return nil, nil, err
	}
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, nil, err
		}
		for _, doc := range strings.Split(string(data), "\n---") {
			var meta metav1.TypeMeta
			if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
				return nil, nil, fmt.Errorf("%s: %w", file, err)
			}
			switch meta.Kind {
			case "MutatingWebhookConfiguration":
				var cfg admissionregistrationv1.MutatingWebhookConfiguration
				if err := yaml.UnmarshalStrict([]byte(doc), &cfg); err != nil {
					return nil, nil, fmt.Errorf("%s: %w", file, err)
				}
				cfg.Webhooks = slices.DeleteFunc(cfg.Webhooks, func(w admissionregistrationv1.MutatingWebhook) bool { return !left(w.Name) })
				mutating = append(mutating, &cfg)
			case "ValidatingWebhookConfiguration":
				var cfg admissionregistrationv1.ValidatingWebhookConfiguration
				if err := yaml.UnmarshalStrict([]byte(doc), &cfg); err != nil {
					return nil, nil, fmt.Errorf("%s: %w", file, err)
				}
				cfg.Webhooks = slices.DeleteFunc(cfg.Webhooks, func(w admissionregistrationv1.ValidatingWebhook) bool { return !left(w.Name) })
				validating = append(validating, &cfg)
			}
		}
	}
	return mutating, validating, nil
}

func yamlFiles(paths []string) ([]string, error) {
	var files []string
	for _, p := range paths {
		info, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		if !info.IsDir() {
			files = append(files, p)
			continue
		}
		matches, err := filepath.Glob(filepath.Join(p, "*.yaml"))
		if err != nil {
			return nil, err
		}
		files = append(files, matches...)
	}
	return files, nil
}
