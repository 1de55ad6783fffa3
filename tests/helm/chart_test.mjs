// The Helm chart's tests: helm/sluice rendered by tests/helm/render (Helm's engine) for a matrix
// of values; every object validated against the Kubernetes OpenAPI schemas (kubernetes-models,
// offline); what each case must produce asserted; refused values refused with their message,
// by values.schema.json and, with the schema skipped, by the chart's own checks.
//
// node tests/helm/chart_test.mjs --render BIN --chart DIR --agent BIN --operator BIN --source DIR
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import assert from 'node:assert/strict';

const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, a, i, all) => (i % 2 ? acc : [...acc, [a.replace(/^--/, ''), all[i + 1]]]), []));
for (const k of ['render', 'chart', 'agent', 'operator', 'source']) {
  if (!args[k]) throw new Error(`--${k} is required`);
}

// The install line of issue 12, as an operator types it.
const ISSUE_INSTALL = ['--set', 'kubeProxyReplacement=true', '--set', 'k8sServiceHost=192.168.10.121',
  '--set', 'k8sServicePort=6443', '--set', 'ipam.mode=cluster-pool',
  '--set', 'ipam.operator.clusterPoolIPv4PodCIDRList={10.11.0.0/16}'];

function render(extra, { schema = true } = {}) {
  const argv = ['-chart', args.chart, '-namespace', 'kube-system', '-o', 'json',
    ...(schema ? [] : ['-skip-schema-validation']), ...extra.map((a) => a.replace(/^--set/, '-set'))];
  const r = spawnSync(args.render, argv, { encoding: 'utf8' });
  return { ok: r.status === 0, stderr: r.stderr, docs: r.status === 0 ? JSON.parse(r.stdout) ?? [] : [] };
}

const modelCache = new Map();
async function validate(obj) {
  const [group, version] = obj.apiVersion.includes('/') ? obj.apiVersion.split('/') : [null, obj.apiVersion];
  const path = `kubernetes-models/${group ? group + '/' : ''}${version}/${obj.kind}`;
  if (!modelCache.has(path)) modelCache.set(path, (await import(path))[obj.kind]);
  new (modelCache.get(path))(obj).validate();
}

// The flags the agent binary has: every ConfigMap key must be one (the agent refuses others).
const agentFlags = new Set(
  // --helpfull lists the agent's own flags, one `  --name=default` line each.
  [...spawnSync(args.agent, ['--helpfull'], { encoding: 'utf8' }).stdout.matchAll(/^\s+--(\w+)[= ]/gm)].map((m) => m[1]));

// The flags sluice-operator has (its --help lists them and exits 0): every arg the chart passes
// it must be one.
const operatorHelp = spawnSync(args.operator, ['--help'], { encoding: 'utf8' });
assert.equal(operatorHelp.status, 0, 'sluice-operator --help exits 0');
// One `  --name=default` line each, as every binary's --help prints them (agent/base/cli).
const operatorFlags = new Set([...operatorHelp.stdout.matchAll(/^\s+--(\w+)=/gm)].map((m) => m[1]));
assert.ok(operatorFlags.has('leader_election_namespace'), 'sluice-operator --help lists its flags');

const valuesDir = mkdtempSync(`${tmpdir()}/sluice-helm-`);
process.on('exit', () => rmSync(valuesDir, { recursive: true, force: true }));

// What the agent watches (agent/k8s/model.h kPath): the ClusterRole must grant exactly that.
const watched = [...readFileSync(`${args.source}/agent/k8s/model.h`, 'utf8')
  .matchAll(/kPath = "\/(api|apis)\/(?:([^/"]+)\/)?v1\/(\w+)"/g)]
  .map(([, root, group, resource]) => `${root === 'api' ? '' : group}/${resource}`).sort();

const objects = (r) => r.docs.map((d) => d.object);
const one = (r, kind, name) => {
  const found = objects(r).filter((o) => o.kind === kind && (!name || o.metadata.name === name));
  assert.equal(found.length, 1, `want one ${kind} ${name ?? ''}, got ${found.length}`);
  return found[0];
};
const none = (r, kind) => assert.equal(objects(r).filter((o) => o.kind === kind).length, 0, `no ${kind} expected`);
const config = (r) => one(r, 'ConfigMap', 'sluice-config').data;
const agentContainer = (r) => one(r, 'DaemonSet', 'sluice').spec.template.spec.containers.find((c) => c.name === 'sluice-agent');

// Kubernetes' toleration matching (k8s.io/api/core/v1 Toleration.ToleratesTaint).
function tolerates(tolerations, taint) {
  return tolerations.some((t) => (!t.effect || t.effect === taint.effect) &&
    (!t.key || t.key === taint.key) &&
    ((t.operator ?? 'Equal') === 'Exists' || (!t.key && false) || t.value === taint.value));
}

function checkDaemonSet(r) {
  const ds = one(r, 'DaemonSet', 'sluice');
  const pod = ds.spec.template.spec;
  assert.equal(pod.hostNetwork, true);
  assert.equal(pod.priorityClassName, 'system-node-critical');
  assert.equal(ds.spec.updateStrategy.type, 'RollingUpdate');
  assert.ok(ds.spec.updateStrategy.rollingUpdate.maxUnavailable >= 1);
  for (const taint of [{ key: 'node.kubernetes.io/not-ready', effect: 'NoSchedule' },
    { key: 'node.kubernetes.io/not-ready', effect: 'NoExecute' },
    { key: 'node.cloudprovider.kubernetes.io/uninitialized', value: 'true', effect: 'NoSchedule' },
    { key: 'node.kubernetes.io/network-unavailable', effect: 'NoSchedule' }]) {
    assert.ok(tolerates(pod.tolerations ?? [], taint), `tolerates ${JSON.stringify(taint)}`);
  }
  // The selector picks the pod template's labels.
  for (const [k, v] of Object.entries(ds.spec.selector.matchLabels)) {
    assert.equal(ds.spec.template.metadata.labels[k], v, `template label ${k}`);
  }
  const all = [...pod.initContainers, ...pod.containers];
  assert.deepEqual(pod.initContainers.map((c) => c.name).slice(0, 2), ['mount-bpf-fs', 'mount-cgroup']);
  for (const c of all) {
    assert.notEqual(c.securityContext?.privileged, true, `${c.name} is not privileged`);
    assert.deepEqual(c.securityContext?.capabilities?.drop, ['ALL'], `${c.name} drops ALL first`);
  }
  const agent = agentContainer(r);
  assert.deepEqual(agent.securityContext.capabilities.add, ['BPF', 'NET_ADMIN', 'NET_BROADCAST', 'PERFMON', 'SYS_RESOURCE', 'SYS_ADMIN']);
  assert.equal(agent.command, undefined, "the image's entrypoint (sluice-agent) runs");
  assert.ok(agent.args.includes('--config_dir=/etc/sluice/config'));
  for (const [probe, path] of [['livenessProbe', '/healthz'], ['readinessProbe', '/readyz'], ['startupProbe', '/healthz']]) {
    assert.equal(agent[probe].httpGet.host, '127.0.0.1', probe);
    assert.equal(agent[probe].httpGet.path, path, probe);
    assert.equal(`127.0.0.1:${agent[probe].httpGet.port}`, config(r).health_address, `${probe} port is --health_address's`);
  }
  // Every mount has its volume; the config volume is the ConfigMap.
  const volumes = new Map(pod.volumes.map((v) => [v.name, v]));
  for (const c of all) for (const m of c.volumeMounts ?? []) assert.ok(volumes.has(m.name), `${c.name} mounts ${m.name}`);
  assert.equal(volumes.get('config').configMap.name, 'sluice-config');
  // The agent's paths in the ConfigMap are where the volumes are mounted.
  const mountOf = (name) => agent.volumeMounts.find((m) => m.name === name).mountPath;
  const cfg = config(r);
  assert.equal(cfg.cni_bin_dir, mountOf('cni-path'));
  assert.equal(cfg.cni_conf_dir, mountOf('cni-conf'));
  assert.equal(cfg.state_dir, mountOf('state'));
  assert.ok(cfg.socket.startsWith(mountOf('run') + '/'));
  assert.ok(cfg.bpffs_root.startsWith(mountOf('bpf-maps') + '/'));
  assert.equal(cfg.cgroup_root, mountOf('cgroup'));
  assert.equal(mountOf('bpf-maps') === volumes.get('bpf-maps').hostPath.path, true, 'bpffs at the host path');
  return { ds, pod, agent, volumes };
}

function checkConfigKeys(r) {
  for (const key of Object.keys(config(r))) {
    assert.ok(agentFlags.has(key), `ConfigMap key ${key} is an agent flag`);
    assert.equal(typeof config(r)[key], 'string');
  }
}

// The agent itself reads the rendered ConfigMap as the kubelet mounts it (one file per key) and
// accepts every value: --uninstall applies the configuration, then only removes Sluice's files
// from the scratch CNI directories the command line points it at.
let scratch = 0;
function agentAcceptsConfig(r) {
  const dir = `${valuesDir}/agent-${scratch++}`;
  mkdirSync(`${dir}/config`, { recursive: true });
  for (const [key, value] of Object.entries(config(r))) {
    writeFileSync(`${dir}/config/${key}`, value);
  }
  const run = spawnSync(args.agent, [`--config_dir=${dir}/config`, '--uninstall',
    `--cni_conf_dir=${dir}/net.d`, `--cni_bin_dir=${dir}/bin`], { encoding: 'utf8' });
  assert.equal(run.status, 0, `the agent refuses the rendered ConfigMap:\n${run.stdout}${run.stderr}`);
}

function checkRbac(r) {
  const role = one(r, 'ClusterRole', 'sluice');
  // One write: Events (agent/k8s/event_poster.h), created only.
  const writes = role.rules.filter((rule) => !rule.verbs.includes('watch'));
  assert.deepEqual(writes, [{ apiGroups: [''], resources: ['events'], verbs: ['create'] }], 'the agent writes Events only');
  const granted = role.rules.filter((rule) => rule.verbs.includes('watch')).flatMap((rule) => rule.apiGroups.flatMap((g) => rule.resources.map((res) => {
    assert.deepEqual([...rule.verbs].sort(), ['get', 'list', 'watch'], `${g}/${res}: read-only`);
    return `${g}/${res}`;
  }))).sort();
  assert.deepEqual(granted, watched, 'ClusterRole grants exactly what agent/k8s watches');
  const binding = one(r, 'ClusterRoleBinding', 'sluice');
  const sa = one(r, 'ServiceAccount', 'sluice');
  assert.equal(binding.subjects[0].name, sa.metadata.name);
  assert.equal(binding.subjects[0].namespace, 'kube-system');
  assert.equal(one(r, 'DaemonSet', 'sluice').spec.template.spec.serviceAccountName, sa.metadata.name);
}

const cases = [
  ['defaults', [], (r) => {
    checkDaemonSet(r); checkRbac(r); checkConfigKeys(r);
    const cfg = config(r);
    assert.equal(cfg.kube_proxy_replacement, 'true');
    assert.equal(cfg.ipam_mode, 'kubernetes');
    assert.equal(cfg.routing_mode, 'tunnel');
    assert.equal(cfg.tunnel_port, '8472');
    assert.equal(cfg.socket_lb, 'true');
    assert.equal(cfg.lb_acceleration, 'disabled');
    assert.equal(cfg.lb_algorithm, 'random');
    assert.equal(cfg.maglev_table_size, '16381');
    assert.equal(cfg.cni_exclusive, 'false');
    assert.equal(cfg.bpffs_root, '/sys/fs/bpf/sluice');
    assert.equal(cfg.metrics_address, undefined);
    assert.equal(cfg.k8s_service_host, undefined);
    none(r, 'Service'); none(r, 'Deployment'); none(r, 'Role');
    assert.equal(agentContainer(r).lifecycle, undefined, 'no preStop uninstall by default');
    assert.equal(agentContainer(r).image, 'sluice/sluice-agent:0.1.0');
  }],
  ['issue 12 install line (cluster-pool, kube-proxy replacement, explicit apiserver)', ISSUE_INSTALL, (r) => {
    checkDaemonSet(r); checkRbac(r); checkConfigKeys(r);
    const cfg = config(r);
    assert.equal(cfg.k8s_service_host, '192.168.10.121');
    assert.equal(cfg.k8s_service_port, '6443');
    assert.equal(cfg.kube_proxy_replacement, 'true');
    assert.equal(cfg.ipam_mode, 'kubernetes', 'agents read the operator-written spec.podCIDR');
    const op = one(r, 'Deployment', 'sluice-operator');
    const c = op.spec.template.spec.containers[0];
    assert.deepEqual(c.command, ['sluice-operator']);
    assert.ok(c.args.includes('--cluster_pool_ipv4_pod_cidr_list=10.11.0.0/16'));
    assert.ok(c.args.includes('--cluster_pool_ipv4_mask_size=24'));
    assert.ok(c.args.includes('--k8s_service_host=192.168.10.121'));
    assert.ok(c.args.includes('--leader_election_namespace=kube-system'));
    for (const a of c.args) {
      assert.ok(operatorFlags.has(a.replace(/^--(\w+)=.*$/, '$1')), `sluice-operator has no flag for ${a}`);
    }
    // Its probes ask the operator's --health_address (loopback: the Deployment is hostNetwork).
    for (const [probe, path] of [['livenessProbe', '/healthz'], ['readinessProbe', '/readyz']]) {
      assert.equal(c[probe].httpGet.path, path, probe);
      assert.ok(c.args.includes(`--health_address=${c[probe].httpGet.host}:${c[probe].httpGet.port}`), `${probe} asks --health_address`);
    }
    assert.ok(!c.args.some((a) => a.startsWith('--metrics_address')), 'operator metrics are off by default');
    assert.equal(c.ports, undefined);
    assert.equal(op.spec.template.spec.serviceAccountName, one(r, 'ServiceAccount', 'sluice-operator').metadata.name);
    const oprole = one(r, 'ClusterRole', 'sluice-operator');
    assert.deepEqual(oprole.rules[0], { apiGroups: [''], resources: ['nodes'], verbs: ['get', 'list', 'watch', 'patch'] });
    const lease = one(r, 'Role', 'sluice-operator');
    assert.equal(lease.metadata.namespace, 'kube-system');
    assert.ok(lease.rules.every((rule) => rule.apiGroups[0] === 'coordination.k8s.io' && rule.resources[0] === 'leases'));
    assert.equal(one(r, 'RoleBinding', 'sluice-operator').roleRef.name, 'sluice-operator');
  }],
  ['cluster-pool with two pools and a /26 per node', ['--set', 'ipam.mode=cluster-pool',
    '--set', 'ipam.operator.clusterPoolIPv4PodCIDRList={10.11.0.0/16,10.12.0.0/16}',
    '--set', 'ipam.operator.clusterPoolIPv4MaskSize=26'], (r) => {
    const c = one(r, 'Deployment', 'sluice-operator').spec.template.spec.containers[0];
    assert.ok(c.args.includes('--cluster_pool_ipv4_pod_cidr_list=10.11.0.0/16,10.12.0.0/16'));
    assert.ok(c.args.includes('--cluster_pool_ipv4_mask_size=26'));
  }],
  ['cluster-pool with operator metrics', ['--set', 'ipam.mode=cluster-pool',
    '--set', 'operator.prometheus.enabled=true', '--set', 'operator.prometheus.port=9999'], (r) => {
    const c = one(r, 'Deployment', 'sluice-operator').spec.template.spec.containers[0];
    assert.ok(c.args.includes('--metrics_address=:9999'));
    assert.deepEqual(c.ports, [{ name: 'metrics', containerPort: 9999, hostPort: 9999, protocol: 'TCP' }]);
  }],
  ['tunnel on another port', ['--set', 'routingMode=tunnel,tunnelPort=9472'], (r) => {
    assert.equal(config(r).routing_mode, 'tunnel');
    assert.equal(config(r).tunnel_port, '9472');
  }],
  ['native routing', ['--set', 'routingMode=native', '--set', 'ipv4NativeRoutingCIDR=10.0.0.0/8',
    '--set', 'autoDirectNodeRoutes=true', '--set', 'MTU=9000'], (r) => {
    checkConfigKeys(r);
    const cfg = config(r);
    assert.equal(cfg.routing_mode, 'native');
    assert.equal(cfg.ipv4_native_routing_cidr, '10.0.0.0/8');
    assert.equal(cfg.auto_direct_node_routes, 'true');
    assert.equal(cfg.mtu, '9000');
  }],
  ['BGP off by default', [], (r) => {
    for (const k of ['bgp_control_plane', 'bgp_peers', 'bgp_local_asn']) assert.equal(config(r)[k], undefined, k);
  }],
  ['prometheus on', ['--set', 'prometheus.enabled=true'], (r) => {
    checkConfigKeys(r);
    assert.equal(config(r).metrics_address, ':9962');
    const svc = one(r, 'Service', 'sluice-metrics');
    assert.equal(svc.spec.clusterIP, 'None');
    const { ds, agent } = checkDaemonSet(r);
    for (const [k, v] of Object.entries(svc.spec.selector)) assert.equal(ds.spec.template.metadata.labels[k], v);
    assert.ok(agent.ports.some((p) => p.name === svc.spec.ports[0].targetPort && p.containerPort === 9962));
  }],
  ['prometheus off', ['--set', 'prometheus.enabled=false'], (r) => {
    none(r, 'Service');
    assert.equal(config(r).metrics_address, undefined);
    assert.equal(agentContainer(r).ports, undefined);
  }],
  ['socket LB off', ['--set', 'socketLB.enabled=false'], (r) => assert.equal(config(r).socket_lb, 'false')],
  ['XDP NodePort acceleration', ['--set', 'loadBalancer.acceleration=native'],
    (r) => assert.equal(config(r).lb_acceleration, 'native')],
  ['Maglev by default, Katran\'s table size', ['--set', 'loadBalancer.algorithm=maglev,maglev.tableSize=65521'],
    (r) => {
      assert.equal(config(r).lb_algorithm, 'maglev');
      assert.equal(config(r).maglev_table_size, '65521');
    }],
  ['kube-proxy kept, no policy, debug', ['--set-string', 'kubeProxyReplacement=false',
    '--set', 'policyEnforcementMode=never,debug.enabled=true'], (r) => {
    assert.equal(config(r).kube_proxy_replacement, 'false');
    assert.equal(config(r).network_policy, 'false');
    assert.equal(config(r).log_level, 'debug');
  }],
  ['CNI: exclusive, uninstall on stop, other directories', ['--set', 'cni.exclusive=true,cni.uninstall=true',
    '--set', 'cni.binPath=/home/kubernetes/bin,cni.confPath=/etc/cni/conf.d'], (r) => {
    assert.equal(config(r).cni_exclusive, 'true');
    const { agent, volumes } = checkDaemonSet(r);
    assert.deepEqual(agent.lifecycle.preStop.exec.command, ['sluice-agent', '--config_dir=/etc/sluice/config', '--uninstall']);
    assert.equal(volumes.get('cni-path').hostPath.path, '/home/kubernetes/bin');
    assert.equal(volumes.get('cni-conf').hostPath.path, '/etc/cni/conf.d');
  }],
  ['no CNI install', ['--set', 'cni.install=false'], (r) => {
    assert.equal(config(r).install_cni, 'false');
    assert.ok(!one(r, 'DaemonSet').spec.template.spec.initContainers.some((c) => c.name === 'install-cni-binaries'));
  }],
  ['image by digest, extra args and env', ['--set', 'image.repository=registry.example/sluice,image.tag=1.2.3',
    '--set', `image.digest=sha256:${'ab'.repeat(32)}`, '--set', 'extraArgs={--log_level=trace}'], (r) => {
    const agent = agentContainer(r);
    assert.equal(agent.image, `registry.example/sluice:1.2.3@sha256:${'ab'.repeat(32)}`);
    assert.deepEqual(agent.args, ['--config_dir=/etc/sluice/config', '--log_level=trace']);
  }],
];

// BGP peers, a list: from a values file (the renderer's --set takes no list indexes).
writeFileSync(`${valuesDir}/bgp.yaml`, 'routingMode: native\nipv4NativeRoutingCIDR: 10.0.0.0/8\n' +
  'bgpControlPlane:\n  enabled: true\n  localASN: 4200000001\n  peers:\n' +
  '  - {peerAddress: 10.1.0.1, peerASN: 65000}\n  - {peerAddress: 10.1.0.2, peerASN: 65001, holdTimeSeconds: 90}\n');
writeFileSync(`${valuesDir}/bgp-keepalive.yaml`, 'bgpControlPlane:\n  enabled: true\n  peers:\n' +
  '  - {peerAddress: 10.1.0.1, peerASN: 65000, holdTimeSeconds: 9, keepAliveTimeSeconds: 9}\n');
writeFileSync(`${valuesDir}/bgp-address.yaml`, 'bgpControlPlane:\n  enabled: true\n  peers:\n' +
  '  - {peerAddress: nope, peerASN: 65000}\n');
cases.push(['BGP control plane', ['-f', `${valuesDir}/bgp.yaml`], (r) => {
  checkConfigKeys(r);
  agentAcceptsConfig(r);
  const cfg = config(r);
  assert.equal(cfg.bgp_control_plane, 'true');
  assert.equal(cfg.bgp_local_asn, '4200000001');
  assert.equal(cfg.bgp_graceful_restart_time, '120');
  assert.equal(cfg.bgp_peers, '10.1.0.1:65000:9:3,10.1.0.2:65001:90:30');
}]);

// A values file as operators keep them: nested keys merge with the defaults, null removes one.
writeFileSync(`${valuesDir}/values.yaml`, 'prometheus:\n  enabled: true\nnodeSelector: null\nk8sServiceHost: 10.0.0.1\nk8sServicePort: 6443\n');
cases.push(['values file, then --set over it', ['-f', `${valuesDir}/values.yaml`, '--set', 'k8sServiceHost=10.0.0.2'], (r) => {
  assert.equal(config(r).metrics_address, ':9962', 'prometheus.port kept from the defaults');
  assert.equal(one(r, 'DaemonSet').spec.template.spec.nodeSelector, undefined, 'null removed nodeSelector');
  assert.equal(config(r).k8s_service_host, '10.0.0.2', '--set wins over -f');
}]);

cases.push(['map sizes', ['--set', 'bpf.ctTcpMax=524288,bpf.ctAnyMax=1048576,bpf.natMax=131072,bpf.lbMapMax=131072,bpf.policyMapMax=65536'], (r) => {
  const c = config(r);
  assert.equal(c.bpf_policy_max, '65536');
  assert.equal(c.bpf_ct_tcp_max, '524288');
  assert.equal(c.bpf_ct_any_max, '1048576');
  assert.equal(c.bpf_nat_max, '131072');
  for (const k of ['bpf_lb_service_max', 'bpf_lb_backend_max', 'bpf_lb_revnat_max']) assert.equal(c[k], '131072', k);
}]);
cases.push(['map sizes unset: the compiled-in ones', [], (r) => {
  for (const k of ['bpf_ct_tcp_max', 'bpf_ct_any_max', 'bpf_nat_max', 'bpf_lb_service_max', 'bpf_policy_max']) assert.equal(config(r)[k], undefined, k);
}]);

// [values, message the schema gives, message the chart's checks give (schema skipped)]
const refused = [
  [['--set', 'ipam.mode=eni'], 'ipam.mode must be one of the following', 'ipam.mode=eni is not supported'],
  [['--set', 'routingMode=foo'], 'routingMode must be one of the following', 'routingMode=foo is not supported'],
  [['--set', 'kubeProxyReplacement=partial'], 'kubeProxyReplacement', 'kubeProxyReplacement=partial is not supported'],
  [['--set', 'kubeProxyReplacement=strict'], 'kubeProxyReplacement', 'kubeProxyReplacement=strict is not supported'],
  [['--set', 'tunnelProtocol=geneve'], 'tunnelProtocol', 'tunnelProtocol=geneve is not supported'],
  [['--set', 'bpf.policyMapMax=100'], 'bpf.policyMapMax', 'bpf.policyMapMax=100: a map size of 1024 to 16777216 entries'],
  [['--set', 'bpf.ctTcpMax=100'], 'bpf.ctTcpMax', 'bpf.ctTcpMax=100: a map size of 1024 to 16777216 entries'],
  [['--set', 'ipv6.enabled=true'], 'ipv6.enabled', 'ipv6.enabled=true is not supported'],
  [['--set', 'loadBalancer.acceleration=best-effort'], 'loadBalancer.acceleration', 'loadBalancer.acceleration=best-effort is not supported'],
  [['--set', 'loadBalancer.algorithm=round-robin'], 'loadBalancer.algorithm', 'loadBalancer.algorithm=round-robin is not supported'],
  [['--set', 'maglev.tableSize=16383'], 'maglev.tableSize', 'maglev.tableSize=16383 is not supported'],
  [['--set', 'policyEnforcementMode=always'], 'policyEnforcementMode', 'policyEnforcementMode=always is not supported'],
  [['--set', 'cni.chainingMode=aws-cni'], 'cni.chainingMode', 'cni.chainingMode=aws-cni is not supported'],
  [['--set', 'prometheus.serviceMonitor.enabled=true'], 'prometheus.serviceMonitor.enabled', 'serviceMonitor.enabled=true is not supported'],
  [['--set', 'ipam.mode=cluster-pool,ipam.operator.clusterPoolIPv4MaskSize=31'], 'clusterPoolIPv4MaskSize', 'at least a /30 per node'],
  // Combinations only the chart's checks see:
  [['--set', 'routingMode=native'], null, 'routingMode=native needs ipv4NativeRoutingCIDR'],
  [['--set', 'autoDirectNodeRoutes=true'], null, 'autoDirectNodeRoutes=true needs routingMode=native'],
  [['--set', 'ipam.mode=cluster-pool,ipam.operator.clusterPoolIPv4PodCIDRList={10.11.0.0/16},ipam.operator.clusterPoolIPv4MaskSize=12'], null, 'is larger than the pool 10.11.0.0/16'],
  [['--set', 'k8sServicePort=6443'], null, 'k8sServicePort is set without k8sServiceHost'],
  [['--set', 'bgpControlPlane.enabled=true'], null, 'bgpControlPlane.enabled=true needs bgpControlPlane.peers'],
  [['-f', `${valuesDir}/bgp-keepalive.yaml`], null, 'keepAliveTimeSeconds must be below holdTimeSeconds'],
  [['-f', `${valuesDir}/bgp-address.yaml`], 'peerAddress', null],
  [['--set', 'k8sServiceHost=192.168.10.121'], null, 'k8sServiceHost needs k8sServicePort'],
  // Cilium values Sluice has no such feature for: the schema refuses unknown keys.
  [['--set', 'hubble.enabled=true'], 'Additional property hubble is not allowed', null],
  [['--set', 'encryption.enabled=true'], 'Additional property encryption is not allowed', null],
  [['--set', 'devices=eth0\\,eth1'], 'devices', null],
];

let passed = 0, failed = 0;
async function check(name, fn) {
  try { await fn(); passed++; console.log(`ok   ${name}`); } catch (e) { failed++; console.log(`FAIL ${name}\n     ${e.message.replace(/\n/g, '\n     ')}`); }
}

for (const [name, values, expect] of cases) {
  await check(name, async () => {
    const r = render(values);
    assert.ok(r.ok, r.stderr);
    assert.ok(r.docs.length > 0);
    for (const d of r.docs) {
      try { await validate(d.object); } catch (e) { throw new Error(`${d.source} ${d.object.kind}: ${e.message}`); }
    }
    expect(r);
    agentAcceptsConfig(r);
  });
}
await check('a changed configuration changes the pod template (the agents roll)', () => {
  const a = one(render([]), 'DaemonSet').spec.template.metadata.annotations['checksum/config'];
  const b = one(render(['--set', 'socketLB.enabled=false']), 'DaemonSet').spec.template.metadata.annotations['checksum/config'];
  assert.notEqual(a, b);
  assert.equal(a, one(render([]), 'DaemonSet').spec.template.metadata.annotations['checksum/config']);
});
for (const [values, schemaMsg, chartMsg] of refused) {
  await check(`refused: ${values.join(' ')}`, () => {
    const withSchema = render(values);
    assert.ok(!withSchema.ok, 'renders nothing');
    if (schemaMsg) {
      assert.match(withSchema.stderr, /values don't meet the specifications of the schema/);
      assert.ok(withSchema.stderr.includes(schemaMsg), withSchema.stderr);
    }
    if (chartMsg) {
      const withoutSchema = render(values, { schema: false });
      assert.ok(!withoutSchema.ok, 'the chart refuses it too');
      assert.ok(withoutSchema.stderr.includes(chartMsg), withoutSchema.stderr);
      assert.match(withoutSchema.stderr, /execution error at \(sluice\/templates\//);
    }
  });
}
await check('NOTES.txt renders and names the install', () => {
  const r = spawnSync(args.render, ['-chart', args.chart, '-namespace', 'kube-system', '-notes', ...ISSUE_INSTALL.map((a) => a.replace(/^--set/, '-set'))], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /cluster-pool, per-node \/24 out of 10\.11\.0\.0\/16/);
  assert.doesNotMatch(r.stdout, /WARNING: k8sServiceHost is empty/);
  assert.doesNotMatch(r.stdout, /<no value>/);
});

console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
