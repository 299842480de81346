-- wrk script: durable meter calls spread over the tasks whose tokens are in $TOKENS_FILE,
-- each request with a unique requestId.
local threads = {}

function setup(thread)
    thread:set("tid", #threads + 1)
    table.insert(threads, thread)
end

function init(args)
    tokens = {}
    for line in io.lines(os.getenv("TOKENS_FILE")) do
        table.insert(tokens, line)
    end
    counter = 0
end

function request()
    counter = counter + 1
    local tok = tokens[(counter % #tokens) + 1]
    local body = string.format(
        '{"requestId":"t%d-%d","iteration":1,"model":"claude-3-7-sonnet","tokensUsed":150,"costUSD":0.0025}',
        tid, counter)
    return wrk.format("POST", "/api/v1/agenttask/meter",
        {["Authorization"] = "Bearer " .. tok, ["Content-Type"] = "application/json"}, body)
end
