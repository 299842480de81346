-- wrk script: GET one AgentTask.
function init(args)
    token = os.getenv("DIVERGE_API_TOKEN")
end

function request()
    return wrk.format("GET", "/apis/divergedev.com/v1alpha1/namespaces/bench/agenttasks/bench-get",
        {["Authorization"] = "Bearer " .. token})
end
