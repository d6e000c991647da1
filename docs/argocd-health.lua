-- Argo CD health check for redrafter.dev/ReDrafterDeployment (Lua 5.1, as Argo CD's gopher-lua runs it).
-- Install: argocd-cm key resource.customizations.health.redrafter.dev_ReDrafterDeployment (docs/gitops-health.md).
-- It reads the same conditions kstatus reads, so Argo CD, Flux and `kubectl wait` agree:
--   the spec not yet observed, or Reconciling=True  -> Progressing
--   Stalled=True (invalid spec, failed build or validation, serving that cannot come up) -> Degraded
--   Ready=True                                      -> Healthy
hs = {}
if obj.status == nil then
  hs.status = "Progressing"
  hs.message = "waiting for the operator to observe the resource"
  return hs
end
local generation = obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and (observed == nil or observed < generation) then
  hs.status = "Progressing"
  hs.message = "waiting for the operator to observe generation " .. tostring(generation)
  return hs
end
local conditions = {}
if obj.status.conditions ~= nil then
  for _, condition in ipairs(obj.status.conditions) do
    conditions[condition.type] = condition
  end
end
local function message(condition)
  if condition.message ~= nil and condition.message ~= "" then
    return (condition.reason or "") .. ": " .. condition.message
  end
  return condition.reason or ""
end
local function verdict(status, condition)
  hs.status = status
  hs.message = message(condition)
  return hs
end
local function is_true(condition)
  return condition ~= nil and condition.status == "True"
end
if is_true(conditions.Stalled) then
  return verdict("Degraded", conditions.Stalled)
end
if is_true(conditions.Reconciling) then
  return verdict("Progressing", conditions.Reconciling)
end
if is_true(conditions.Ready) then
  return verdict("Healthy", conditions.Ready)
end
if conditions.Ready ~= nil then
  return verdict("Progressing", conditions.Ready)
end
hs.status = "Progressing"
hs.message = "waiting for the Ready condition"
return hs
