-- wrk script: POST a new AgentTask with a unique name per request.
local threads = {}
local counter = 0

function setup(thread)
    thread:set("tid", #threads + 1)
    table.insert(threads, thread)
end

function init(args)
    token = os.getenv("DIVERGE_API_TOKEN")
    counter = 0
    -- A fresh sequence per run: a second run against the same server makes new names.
    math.randomseed(os.time() * 100 + tid)
end

function request()
    counter = counter + 1
    local name = string.format("bench-%d-%d-%d", tid, counter, math.random(1, 1000000000))
    local body = string.format(
        '{"apiVersion":"divergedev.com/v1alpha1","kind":"AgentTask","metadata":{"name":"%s"},' ..
        '"spec":{"objective":"benchmark task","budgetUSD":"5.00","budgetTokens":200000}}', name)
    return wrk.format("POST", "/apis/divergedev.com/v1alpha1/namespaces/bench/agenttasks",
        {["Authorization"] = "Bearer " .. token, ["Content-Type"] = "application/json"}, body)
end

function response(status, headers, body)
    if status ~= 201 then
        errors_seen = (errors_seen or 0) + 1
    end
end
