{{/*
Refuses, with a message naming the value, what Sluice does not support. values.schema.json
refuses the same values first; these checks keep the message clear when a schema check is skipped
(helm --skip-schema-validation) and cover what a schema cannot say (combinations).
*/}}
{{- define "sluice.validate" -}}
{{- $v := .Values -}}
{{- $kpr := $v.kubeProxyReplacement | toString -}}
{{- if not (has $kpr (list "true" "false")) -}}
{{- fail (printf "kubeProxyReplacement=%s is not supported: Sluice replaces kube-proxy fully (true) or not at all (false); Cilium's strict/partial/probe/disabled modes do not exist here" $kpr) -}}
{{- end -}}
{{- if not (has $v.ipam.mode (list "kubernetes" "cluster-pool")) -}}
{{- fail (printf "ipam.mode=%s is not supported: use kubernetes (Node spec.podCIDR) or cluster-pool (sluice-operator)" $v.ipam.mode) -}}
{{- end -}}
{{- if eq $v.ipam.mode "cluster-pool" -}}
{{- if empty $v.ipam.operator.clusterPoolIPv4PodCIDRList -}}
{{- fail "ipam.mode=cluster-pool needs ipam.operator.clusterPoolIPv4PodCIDRList (e.g. {10.0.0.0/8})" -}}
{{- end -}}
{{- range $v.ipam.operator.clusterPoolIPv4PodCIDRList -}}
{{- $mask := atoi (last (splitList "/" .)) -}}
{{- if gt (int $v.ipam.operator.clusterPoolIPv4MaskSize) 30 -}}
{{- fail (printf "ipam.operator.clusterPoolIPv4MaskSize=%v: Sluice needs at least a /30 per node" $v.ipam.operator.clusterPoolIPv4MaskSize) -}}
{{- end -}}
{{- if lt (int $v.ipam.operator.clusterPoolIPv4MaskSize) $mask -}}
{{- fail (printf "ipam.operator.clusterPoolIPv4MaskSize=%v is larger than the pool %s" $v.ipam.operator.clusterPoolIPv4MaskSize .) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if not (has $v.routingMode (list "tunnel" "native")) -}}
{{- fail (printf "routingMode=%s is not supported: use tunnel (VXLAN) or native" $v.routingMode) -}}
{{- end -}}
{{- if ne $v.tunnelProtocol "vxlan" -}}
{{- fail (printf "tunnelProtocol=%s is not supported: Sluice tunnels with vxlan only" $v.tunnelProtocol) -}}
{{- end -}}
{{- if and (eq $v.routingMode "native") (not $v.ipv4NativeRoutingCIDR) -}}
{{- fail "routingMode=native needs ipv4NativeRoutingCIDR: the range routed without masquerade (the cluster's pod CIDRs)" -}}
{{- end -}}
{{- if and $v.autoDirectNodeRoutes (ne $v.routingMode "native") -}}
{{- fail "autoDirectNodeRoutes=true needs routingMode=native" -}}
{{- end -}}
{{- if and $v.bgpControlPlane.enabled (not $v.bgpControlPlane.peers) -}}
{{- fail "bgpControlPlane.enabled=true needs bgpControlPlane.peers (peerAddress, peerASN)" -}}
{{- end -}}
{{- range $v.bgpControlPlane.peers -}}
{{- $hold := int64 (default 9 .holdTimeSeconds) -}}
{{- if and .keepAliveTimeSeconds (ge (int64 .keepAliveTimeSeconds) $hold) -}}
{{- fail (printf "bgpControlPlane.peers: %s: keepAliveTimeSeconds must be below holdTimeSeconds (%d)" .peerAddress $hold) -}}
{{- end -}}
{{- end -}}
{{- if and $v.k8sServicePort (not $v.k8sServiceHost) -}}
{{- fail "k8sServicePort is set without k8sServiceHost" -}}
{{- end -}}
{{- if and $v.k8sServiceHost (not $v.k8sServicePort) -}}
{{- fail "k8sServiceHost needs k8sServicePort (the apiserver's port, e.g. 6443)" -}}
{{- end -}}
{{- if $v.ipv6.enabled -}}
{{- fail "ipv6.enabled=true is not supported: Sluice's datapath is IPv4 only" -}}
{{- end -}}
{{- if not (has $v.loadBalancer.acceleration (list "native" "disabled")) -}}
{{- fail (printf "loadBalancer.acceleration=%s is not supported: use native (XDP, generic XDP where the driver lacks native) or disabled" $v.loadBalancer.acceleration) -}}
{{- end -}}
{{- if not (has $v.loadBalancer.algorithm (list "random" "maglev")) -}}
{{- fail (printf "loadBalancer.algorithm=%s is not supported: use random or maglev" $v.loadBalancer.algorithm) -}}
{{- end -}}
{{- if not (has (int64 $v.maglev.tableSize | toString) (list "251" "509" "1021" "2039" "4093" "8191" "16381" "32749" "65521" "131071")) -}}
{{- fail (printf "maglev.tableSize=%v is not supported: use a prime of 251, 509, 1021, 2039, 4093, 8191, 16381, 32749, 65521 or 131071" $v.maglev.tableSize) -}}
{{- end -}}
{{- if not (has $v.policyEnforcementMode (list "default" "never")) -}}
{{- fail (printf "policyEnforcementMode=%s is not supported: use default (NetworkPolicies enforced) or never" $v.policyEnforcementMode) -}}
{{- end -}}
{{- if ne $v.cni.chainingMode "none" -}}
{{- fail (printf "cni.chainingMode=%s is not supported: Sluice is the only CNI of a node (none)" $v.cni.chainingMode) -}}
{{- end -}}
{{- range $k := list "ctTcpMax" "ctAnyMax" "natMax" "lbMapMax" "policyMapMax" -}}
{{- $n := index $v.bpf $k -}}
{{- if not (kindIs "invalid" $n) -}}
{{- if or (lt (int64 $n) 1024) (gt (int64 $n) 16777216) -}}
{{- fail (printf "bpf.%s=%v: a map size of 1024 to 16777216 entries" $k $n) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if $v.prometheus.serviceMonitor.enabled -}}
{{- fail "prometheus.serviceMonitor.enabled=true is not supported yet: scrape the sluice-metrics Service instead" -}}
{{- end -}}
{{- if contains "," (toString $v.devices) -}}
{{- fail (printf "devices=%s: Sluice drives one native device; name one" $v.devices) -}}
{{- end -}}
{{- end -}}
