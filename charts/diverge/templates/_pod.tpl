{{/*
The pod of both Deployments: `diverge serve` (SPEC §2, §11), one role each.
Called with (dict "root" $ "role" "server"|"controller" "cfg" .Values.server|.Values.controller).
Secrets (macaroon root key, admin token, TLS key) are copied by an init container into the
data volume with mode 0600 and the server's uid: `serve` refuses secret files that belong
to another user or that others can read (SPEC §2), and Kubernetes mounts them as root.
*/}}
{{- define "diverge.pod" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
metadata:
  labels:
    {{- include "diverge.selectorLabels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ .role }}
  {{- with .cfg.podAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  {{- /* sqlite: the server pod also reconciles, so it needs the controller's rights. */}}
  serviceAccountName: {{ include "diverge.fullname" $root }}-{{ ternary "controller" .role (eq $v.server.store "sqlite") }}
  # The server reaches the API server with this token (--store kubernetes).
  automountServiceAccountToken: true
  enableServiceLinks: false
  {{- with $v.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    runAsNonRoot: true
    runAsUser: 10001
    runAsGroup: 10001
    fsGroup: 10001
    seccompProfile:
      type: RuntimeDefault
    {{- if lt (int $v.server.tlsPort) 1024 }}
    # Binds the TLS listener to a port below 1024 without root or NET_BIND_SERVICE
    # (a namespaced "safe" sysctl, allowed by the baseline and restricted standards).
    sysctls:
      - name: net.ipv4.ip_unprivileged_port_start
        value: {{ $v.server.tlsPort | quote }}
    {{- end }}
  initContainers:
    - name: secrets
      image: {{ include "diverge.image" $root }}
      imagePullPolicy: {{ $v.image.pullPolicy }}
      command:
        - /bin/sh
        - -ec
        - |
          umask 077
          mkdir -p /var/lib/diverge/secrets
          cp /etc/diverge/macaroon/macaroon-root-key /var/lib/diverge/secrets/macaroon-root-key
          cp /etc/diverge/api-token/api-token /var/lib/diverge/secrets/api-token
          cp /etc/diverge/tls/tls.crt /etc/diverge/tls/tls.key /var/lib/diverge/secrets/
          {{- if and (eq $v.server.store "kubernetes") (eq $v.sandbox.provider "agent-sandbox") $v.repositories.enabled }}
          # Repository mirrors and staging repos live on the shared volume: sandbox pods
          # clone and push through any replica (the Service), and a new leader pushes
          # what the pod pushed before the handover (docs/cluster-mode.md "Together").
          mkdir -p /var/lib/diverge/data /var/lib/diverge/repos/mirrors /var/lib/diverge/repos/staging
          ln -sfn /var/lib/diverge/repos/mirrors /var/lib/diverge/data/mirrors
          ln -sfn /var/lib/diverge/repos/staging /var/lib/diverge/data/staging
          {{- end }}
      securityContext:
        {{- include "diverge.containerSecurityContext" $root | nindent 8 }}
      resources:
        requests:
          cpu: 10m
          memory: 16Mi
        limits:
          cpu: 100m
          memory: 32Mi
      volumeMounts:
        - name: data
          mountPath: /var/lib/diverge
        {{- if and (eq $v.server.store "kubernetes") (eq $v.sandbox.provider "agent-sandbox") $v.repositories.enabled }}
        - name: repos
          mountPath: /var/lib/diverge/repos
        {{- end }}
        - name: macaroon
          mountPath: /etc/diverge/macaroon
          readOnly: true
        - name: api-token
          mountPath: /etc/diverge/api-token
          readOnly: true
        - name: tls
          mountPath: /etc/diverge/tls
          readOnly: true
  containers:
    - name: diverge
      image: {{ include "diverge.image" $root }}
      imagePullPolicy: {{ $v.image.pullPolicy }}
      args:
        - serve
        - --listen=0.0.0.0:{{ $v.server.httpPort }}
        - --tls-listen=0.0.0.0:{{ $v.server.tlsPort }}
        - --tls-cert-file=/var/lib/diverge/secrets/tls.crt
        - --tls-key-file=/var/lib/diverge/secrets/tls.key
        - --data-dir=/var/lib/diverge/data
        - --macaroon-root-key-file=/var/lib/diverge/secrets/macaroon-root-key
        - --api-token-file=/var/lib/diverge/secrets/api-token
        - --public-url={{ include "diverge.publicURL" $root }}
        - --store={{ $v.server.store }}
        {{- if eq $v.server.store "kubernetes" }}
        # The Lease, the token index Secret and the queue ConfigMaps live here (the Roles
        # below grant them in this namespace only).
        - --kube-namespace={{ $root.Release.Namespace }}
        {{- if eq .role "controller" }}
        # The holder of this Lease (the one the controller Role names) runs the
        # controller and the SCM workers; the other controller replicas wait.
        - --leader-elect=true
        - --lease-name={{ include "diverge.fullname" $root }}-leader
        {{- else }}
        # Serves the API, webhooks and the meter only: never takes the Lease, never
        # reconciles (its service account may not write Leases, SandboxClaims or tokens).
        - --leader-elect=false
        {{- end }}
        {{- end }}
        - --sandbox-provider={{ $v.sandbox.provider }}
        - --log-format={{ $v.server.logFormat }}
        {{- with $v.server.previewBaseURL }}
        - --preview-base-url={{ . }}
        {{- end }}
        {{- range .cfg.extraArgs }}
        - {{ . | quote }}
        {{- end }}
      env:
        - name: POD_NAME
          valueFrom:
            fieldRef:
              fieldPath: metadata.name
        - name: POD_NAMESPACE
          valueFrom:
            fieldRef:
              fieldPath: metadata.namespace
        {{- if eq $v.sandbox.provider "agent-sandbox" }}
        # The SandboxWarmPool that SandboxClaims name in spec.warmPoolRef (SPEC §11).
        - name: DIVERGE_SANDBOX_WARMPOOL
          value: {{ include "diverge.fullname" $root }}-sandbox
        {{- end }}
        {{- with .cfg.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- with $v.server.envFromSecret }}
      envFrom:
        - secretRef:
            name: {{ . }}
      {{- end }}
      ports:
        - name: http
          containerPort: {{ $v.server.httpPort }}
          protocol: TCP
        - name: https
          containerPort: {{ $v.server.tlsPort }}
          protocol: TCP
      # /healthz: the process answers (liveness); /readyz: database open, workers
      # running (SPEC §3), at least --data-dir-reserve free on the data dir.
      startupProbe:
        httpGet:
          path: /healthz
          port: http
        periodSeconds: 2
        failureThreshold: 30
      livenessProbe:
        httpGet:
          path: /healthz
          port: http
        periodSeconds: 10
        timeoutSeconds: 3
        failureThreshold: 3
      readinessProbe:
        httpGet:
          path: /readyz
          port: http
        periodSeconds: 5
        timeoutSeconds: 3
        failureThreshold: 3
      resources:
        {{- toYaml .cfg.resources | nindent 8 }}
      securityContext:
        {{- include "diverge.containerSecurityContext" $root | nindent 8 }}
      volumeMounts:
        - name: data
          mountPath: /var/lib/diverge
        {{- if and (eq $v.server.store "kubernetes") (eq $v.sandbox.provider "agent-sandbox") $v.repositories.enabled }}
        - name: repos
          mountPath: /var/lib/diverge/repos
        {{- end }}
        - name: tmp
          mountPath: /tmp
  volumes:
    - name: data
      {{- if and $v.persistence.enabled (eq $v.server.store "sqlite") }}
      persistentVolumeClaim:
        claimName: {{ include "diverge.fullname" $root }}-data
      {{- else }}
      emptyDir: {}
      {{- end }}
    {{- if and (eq $v.server.store "kubernetes") (eq $v.sandbox.provider "agent-sandbox") $v.repositories.enabled }}
    - name: repos
      persistentVolumeClaim:
        claimName: {{ include "diverge.fullname" $root }}-repos
    {{- end }}
    - name: tmp
      emptyDir:
        medium: Memory
        sizeLimit: 64Mi
    - name: macaroon
      secret:
        secretName: {{ include "diverge.macaroonSecret" $root }}
        defaultMode: 0440
        items:
          - key: macaroon-root-key
            path: macaroon-root-key
    - name: api-token
      secret:
        secretName: {{ include "diverge.fullname" $root }}-api-token
        defaultMode: 0440
        items:
          - key: api-token
            path: api-token
    - name: tls
      secret:
        secretName: {{ include "diverge.tlsSecret" $root }}
        defaultMode: 0440
        items:
          - key: tls.crt
            path: tls.crt
          - key: tls.key
            path: tls.key
  {{- with .cfg.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .cfg.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .cfg.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}
