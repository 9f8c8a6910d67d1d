package deploy

import (
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// scaledObject mirrors the fields of KEDA's keda.sh/v1alpha1 ScaledObject
// (github.com/kedacore/keda/v2/apis/keda/v1alpha1) that the manifests may
// use, with the same JSON names. KEDA's own Go module is not imported: it is
// the whole operator, with controller-runtime and every scaler's client
// library. Decoded strictly, a field outside this list fails the test, so a
// new field is added here, checked against KEDA's CRD, deliberately.
type scaledObject struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              scaledObjectSpec `json:"spec"`
}

type scaledObjectSpec struct {
	ScaleTargetRef   scaleTarget     `json:"scaleTargetRef"`
	PollingInterval  *int32          `json:"pollingInterval,omitempty"`
	InitialCooldown  *int32          `json:"initialCooldownPeriod,omitempty"`
	CooldownPeriod   *int32          `json:"cooldownPeriod,omitempty"`
	IdleReplicaCount *int32          `json:"idleReplicaCount,omitempty"`
	MinReplicaCount  *int32          `json:"minReplicaCount,omitempty"`
	MaxReplicaCount  *int32          `json:"maxReplicaCount,omitempty"`
	Advanced         *advancedConfig `json:"advanced,omitempty"`
	Triggers         []scaleTrigger  `json:"triggers"`
	Fallback         *fallback       `json:"fallback,omitempty"`
}

type scaleTarget struct {
	Name                   string `json:"name"`
	APIVersion             string `json:"apiVersion,omitempty"`
	Kind                   string `json:"kind,omitempty"`
	EnvSourceContainerName string `json:"envSourceContainerName,omitempty"`
}

type advancedConfig struct {
	HorizontalPodAutoscalerConfig *hpaConfig `json:"horizontalPodAutoscalerConfig,omitempty"`
	RestoreToOriginalReplicaCount bool       `json:"restoreToOriginalReplicaCount,omitempty"`
}

type hpaConfig struct {
	Name     string                                         `json:"name,omitempty"`
	Behavior *autoscalingv2.HorizontalPodAutoscalerBehavior `json:"behavior,omitempty"`
}

type scaleTrigger struct {
	Type              string            `json:"type"`
	Name              string            `json:"name,omitempty"`
	UseCachedMetrics  bool              `json:"useCachedMetrics,omitempty"`
	Metadata          map[string]string `json:"metadata"`
	AuthenticationRef *struct {
		Name string `json:"name"`
		Kind string `json:"kind,omitempty"`
	} `json:"authenticationRef,omitempty"`
	MetricType autoscalingv2.MetricTargetType `json:"metricType,omitempty"`
}

type fallback struct {
	FailureThreshold int32 `json:"failureThreshold"`
	Replicas         int32 `json:"replicas"`
}
